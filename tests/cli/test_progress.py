"""Progress without a terminal: one plain line per finished case, a summary on schedule, and every
string from a case or a backend printed inert."""

from __future__ import annotations

import io

from rich.console import Console

from operatorx.cli.progress import BarReporter, LogReporter, make_reporter
from operatorx.result import Row
from operatorx.spec import Case

CASE = Case.model_validate({"type": "gemm", "sources": ["m/x"], "args": {
    "m": 8, "n": 64, "k": 64, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "out": "bf16"}})


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


def test_a_line_per_case_and_a_summary():
    console, buf = _console()
    rep = LogReporter(console, summary_every_s=0.0)
    rep.start("r1", 2, ["gpu0", "gpu1"])
    rep.worker_ready("gpu0", {"device": {"name": "NVIDIA H200"}})
    rep.case_done("gpu0", Row(case=CASE, backend="torch", status="unsupported", testlist="t", case_index=3,
                              message="no kernel [/red]\x1b[31m here"))
    rep.case_done("gpu1", Row.missing(CASE, "torch", "t", 4))
    rep.finish()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "run r1: 2 cases on 2 workers (gpu0, gpu1)"
    assert lines[1] == "gpu0: ready on NVIDIA H200"
    assert lines[2] == "[1/2] case 3 gemm 8x64x64 unsupported - (gpu0)  no kernel [/red] here"
    assert any(line.startswith("progress: 1/2 done (1 unsupported)") for line in lines)
    assert lines[-1].startswith("done: 2/2 (1 missing, 1 unsupported)")
    assert "\x1b" not in buf.getvalue()


def test_the_bar_only_on_a_terminal():
    console, _ = _console()
    assert isinstance(make_reporter(console), LogReporter)
    assert isinstance(BarReporter(console), BarReporter)
