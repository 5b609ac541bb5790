"""Package names that load on first use (operatorx/lazy.py), and what that buys: `operatorx run`
spawns its workers before the database, the result and case models or the tables are imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from operatorx.lazy import lazy_names


def test_a_lazy_name_loads_from_its_module_and_an_unknown_one_is_an_attribute_error():
    getattr_ = lazy_names("pkg", {"dumps": "json"})
    import json

    assert getattr_("dumps") is json.dumps
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getattr_("loads")


def test_the_packages_still_give_their_names_and_their_submodules():
    from operatorx import backends, measure, report, run, spec, store

    assert spec.Case.__name__ == "Case" and store.Store.__name__ == "Store"
    assert run.RunConfig.__name__ == "RunConfig" and measure.TimingSettings.__name__ == "TimingSettings"
    assert report.rows_table.__name__ == "rows_table" and backends.get_backend.__name__ == "get_backend"
    from operatorx.spec import testlist  # a submodule, not a name of the package

    assert testlist.TestlistError is spec.TestlistError


def test_the_cli_and_the_sweep_import_no_database_models_or_tables_before_the_spawn():
    """What `operatorx run` imports before it spawns its workers (each second here delays them)."""
    heavy = ["sqlalchemy", "operatorx.result", "operatorx.spec.case", "operatorx.store.db", "operatorx.report.table",
             "operatorx.web.queries", "operatorx.catalog.generate", "torch"]
    code = ("import sys, operatorx.entry, operatorx.cli, operatorx.run.sweep, operatorx.run.worker_process\n"
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
