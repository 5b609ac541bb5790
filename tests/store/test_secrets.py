"""A database password never leaves the parent: its display form is what messages, documents and
stored runs carry; workers get no database and no secret variable."""

from __future__ import annotations

import json

import pytest

from operatorx.run.config import RunConfig
from operatorx.run.counters import _db_by_env
from operatorx.run.gpus import worker_env
from operatorx.run.job import JobSpec
from operatorx.run.metadata import behaviour_env
from operatorx.store import Store, StoreError, check_db
from operatorx.store.redact import hide_password
from operatorx.store.target import parse_db
from tests.store.conftest import planned

PLANTED = "Pl4nted-s3cret"


@pytest.mark.parametrize("given, shown", [
    (f"postgresql://ox:{PLANTED}@db.team:5432/bench", "postgresql://ox:***@db.team:5432/bench"),
    (f"postgresql+psycopg://ox:{PLANTED}@h/b?sslmode=require", "postgresql+psycopg://ox:***@h/b?sslmode=require"),
    (f"postgresql://ox@h/b?sslmode=require&password={PLANTED}", "postgresql://ox@h/b?sslmode=require&password=***"),
    (f"error at postgresql://ox:{PLANTED}@h/b: refused", "error at postgresql://ox:***@h/b: refused"),
    ("postgresql://ox@h:5432/b", "postgresql://ox@h:5432/b"),
    ("runs/h200.db", "runs/h200.db"),
])
def test_hide_password(given, shown):
    assert hide_password(given) == shown


def test_a_target_never_shows_its_password():
    target = parse_db(f"postgresql://ox:{PLANTED}@db.team/bench?password={PLANTED}")
    for text in (target.display(), target.flag(), repr(target), target.scrub(f"FATAL: {PLANTED} wrong")):
        assert PLANTED not in text, text
    assert target.display() == "postgresql://ox:***@db.team/bench"       # the option is the URL's password
    assert target.flag() == "--db 'postgresql://ox:***@db.team/bench'"
    assert parse_db(f"postgresql://ox@h/b?password={PLANTED}").url.password == PLANTED  # type: ignore[union-attr]
    encoded = parse_db("postgresql://ox:p%40ss%2Fword@h/b")                     # the driver sees it decoded
    assert encoded.scrub("auth failed for p@ss/word") == "auth failed for ***"


@pytest.mark.parametrize("db", [f"mysql://ox:{PLANTED}@h/b", f"postgresql+asyncpg://ox:{PLANTED}@h/b",
                                f"postgresql://ox:{PLANTED}@h", f"postgresql://ox:{PLANTED}@h:notaport/b"])
def test_refused_urls_are_named_without_their_password(db):
    with pytest.raises(StoreError) as got:
        check_db(db, create=False)
    assert PLANTED not in str(got.value) and "***" in str(got.value)


def test_unreachable_server_is_named_without_the_password():
    with pytest.raises(StoreError, match="cannot reach PostgreSQL") as got:
        Store(f"postgresql://postgres:{PLANTED}@127.0.0.1:1/x")
    assert PLANTED not in str(got.value)


def test_the_record_hides_the_password_and_workers_get_no_database():
    config = RunConfig(testlist="t", db=f"postgresql://ox:{PLANTED}@h/b")
    spec = JobSpec(config=config, run_id="r1", testlist="t")
    assert spec.to_json()["config"]["db"] == "postgresql://ox:***@h/b"
    sent = spec.worker_json()
    assert "db" not in sent["config"] and PLANTED not in json.dumps(sent)
    assert JobSpec.from_json(sent).config.db == ""               # a worker holds no database at all


def test_secret_variables_stay_in_the_parent(monkeypatch):
    monkeypatch.setenv("OPERATORX_DB", f"postgresql://ox:{PLANTED}@h/b")
    monkeypatch.setenv("PGPASSWORD", PLANTED)
    monkeypatch.setenv("OPERATORX_DB_BUSY_TIMEOUT_S", "7")
    env = worker_env(None, 2)
    assert "OPERATORX_DB" not in env and "PGPASSWORD" not in env and env["OPERATORX_DB_BUSY_TIMEOUT_S"] == "7"
    recorded = behaviour_env()
    assert "OPERATORX_DB" not in recorded and recorded["OPERATORX_DB_BUSY_TIMEOUT_S"] == "7"


def test_counters_hands_a_password_to_its_child_by_environment():
    child = ["python", "-m", "operatorx", "run", "-t", "x", "--db", f"postgresql://ox:{PLANTED}@h/b", "--device",
             "cuda"]
    args, env = _db_by_env(child, f"postgresql://ox:{PLANTED}@h/b")
    assert PLANTED not in " ".join(args) and env["OPERATORX_DB"] == f"postgresql://ox:{PLANTED}@h/b"
    assert args[-2:] == ["--device", "cuda"]
    plain = ["python", "-m", "operatorx", "run", "--db=ox.db"]
    assert _db_by_env(plain, "ox.db")[0] == plain                  # no password: the command line as it was


def test_a_stored_run_holds_the_display_form_only(db_url):
    """Both stores: the run record (its info, `job` included) read back raw holds no password."""
    from sqlalchemy import text

    secret_db = db_url if "://" not in db_url else db_url.replace("postgres@", f"postgres:{PLANTED}@")
    config = RunConfig(testlist="t", db=f"postgresql://ox:{PLANTED}@h/b" if "://" not in db_url else secret_db)
    store = Store(secret_db)
    spec = JobSpec(config=config, run_id="r-secret", testlist="t")
    store.begin_run("r-secret", "2026-11-30T00:00:00", "t", "torch", "cpu", {"job": spec.to_json()}, planned(2))
    with store.engine.connect() as conn:
        raw = [repr(tuple(r)) for table in ("ox_runs", "ox_rows", "ox_cases")
               for r in conn.execute(text(f"SELECT * FROM {table}"))]
    assert raw and PLANTED not in "\n".join(raw) and "***" in "\n".join(raw)
    assert PLANTED not in json.dumps(store.document("r-secret")) and PLANTED not in store.url
