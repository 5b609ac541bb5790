"""Output safety: rich markup, ANSI/OSC, Markdown/HTML, CSV formulas, and tables at 80 and 100 columns."""

from __future__ import annotations

import csv
import io
import json

import pytest
from rich.console import Console

from operatorx.report import rows_markdown, rows_table
from operatorx.report.ab import ab_markdown, ab_table
from operatorx.report.csv import document_csv
from operatorx.report.safe import csv_cell, md_cell, plain, term
from operatorx.spec import Case
from operatorx.store import document_csv as store_document_csv
from tests.report.rows import make_row

HOSTILE = [
    "backend said [/m] and [bold]x[/bold]",
    "[enforce fail at alloc_cpu.cpp:127] err == 0",
    "py:b.py:ok[x=1]",
    "inj[v2].json",
    "\x1b[31mred\x1b[0m \x1b]8;;http://evil\x07link\x1b]8;;\x07 \x1b]0;title\x1b\\",
    "a\rb\nc\td\x00e\x07f\u202eg",
    "<script>alert(1)</script><img src=x onerror=alert(1)> | pipe",
    "trailing backslash \\",
    "two trailing backslashes \\\\",
]


def _render(renderable, width: int = 200) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("text", HOSTILE)
def test_term_prints_the_text_itself_with_no_escape_sequences(text):
    out = _render(term(text), 400).rstrip("\n")
    assert out == plain(text)
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x00" not in out
    assert "\u202e" not in out


def test_markup_looking_text_keeps_its_brackets():
    assert _render(term("py:b.py:ok[x=1]")).strip() == "py:b.py:ok[x=1]"
    assert _render(term("inj[v2].json")).strip() == "inj[v2].json"
    assert "[enforce fail at alloc_cpu.cpp:127]" in _render(term(HOSTILE[1]))


def test_ansi_and_osc_are_stripped_but_their_visible_text_kept():
    assert plain(HOSTILE[4]) == "red link "


def test_markdown_cells_escape_pipes_breaks_and_html():
    cell = md_cell("a|b\r\nc<script>x</script>&")
    assert cell == "a\\|b c&lt;script&gt;x&lt;/script&gt;&amp;"
    assert md_cell("x\\|y") == "x\\\\\\|y"          # an escaped backslash, then an escaped pipe


@pytest.mark.parametrize("value,expected", [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1", "'+1"), ("-2+3", "'-2+3"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("\rx", "'\rx"), ("fine", "fine"), (-1.5, -1.5), (None, None),
    (["a;b", "c,d"], '["a;b","c,d"]'),
])
def test_csv_cells(value, expected):
    assert csv_cell(value) == expected


def _doc(rows):
    return {"schema_version": "1", "run": {"id": "r"}, "rows": [r.to_json() for r in rows]}


def test_csv_export_neutralises_formulas_and_keeps_sources_as_json():
    case = Case.model_validate({"type": "gemm", "sources": ["org/m;x/q_proj", "=cmd|' /C calc'!A0"], "args": {
        "m": 1, "n": 2, "k": 3, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}}})
    row = make_row("error", message="=1+1 \x1b[31mboom", case=case)
    text = document_csv(_doc([row]))
    assert store_document_csv(_doc([row])) == text              # the old import path keeps working
    (line,) = list(csv.DictReader(io.StringIO(text)))
    assert line["message"] == "'=1+1 boom"
    assert json.loads(line["sources"]) == case.sources           # splits back exactly
    assert line["scheme"] == "bf16"


def test_csv_export_of_an_ab_row_fills_the_ab_columns_and_the_scheme():
    ab = {"label": "gemm 1x2x3", "status": "ok", "device": {"a_us": 10.0, "b_us": 9.0, "diff_us": -1.0,
                                                               "ci_low_us": -1.2, "ci_high_us": -0.8,
                                                               "verdict": "faster"}}
    row = make_row("ok").to_json()
    row["metrics"] = {"ab": ab}
    (line,) = list(csv.DictReader(io.StringIO(document_csv({"rows": [row]}))))
    assert (line["ab_clock"], line["a_latency_us"], line["b_latency_us"], line["verdict"]) == (
        "device", "10.0", "9.0", "faster")
    assert line["scheme"] == "bf16"


def _hostile_rows():
    long_reason = ("fp8 on CPU: torch has no native fp8 matrix kernel on this device; "
                   "the end of this reason must be shown, not cut at sixty characters: THE-END")
    moe = Case.model_validate({"type": "moe", "args": {
        "tokens": 2048, "hidden": 7168,
        "experts": {"num": 256, "top_k": 8, "inter": 2048, "w1": {"dtype": "bf16"}, "w2": {"dtype": "bf16"}},
        "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}},
        "activation": {"kind": "silu"}}})
    rows = [make_row("unsupported", message=long_reason, index=0),
            make_row("error", message=HOSTILE[0] + " " + HOSTILE[4], index=1),
            make_row("ok", index=2, case=moe, latency_us=123456.78, tflops=1234.5, gbps=4567.8, pct_peak=98.7)]
    return rows, long_reason


@pytest.mark.parametrize("width", [80, 100])
def test_the_rows_table_fits_the_terminal_and_keeps_every_word(width):
    rows, long_reason = _hostile_rows()
    out = _render(rows_table([r.to_json() for r in rows], title="run inj[v2].json"), width)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, out
    flat = " ".join(out.split())
    assert "THE-END" in flat and "inj[v2].json" in flat and "[/m]" in flat
    for header in ("latency_us", "TFLOP/s", "GB/s", "% peak", "status"):
        assert header in out                           # headers whole, on one line
    for number in ("123,457", "1,234", "4,568", "98.7"):
        assert number in out                           # numbers never split
    assert "2048" in out and "7168" in out             # label numbers whole ("T=2048", "H=7168")
    assert "\x1b" not in out


def test_at_200_columns_the_note_stays_in_its_column():
    rows, _ = _hostile_rows()
    out = _render(rows_table(rows), 200)
    assert "┃ note" in out and "THE-END" in " ".join(out.split())


def test_markdown_rows_are_one_line_each_and_inert():
    rows, _ = _hostile_rows()
    rows.append(make_row("error", message=HOSTILE[6] + "\r\nnext", index=3))
    text = rows_markdown(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "<script>" not in text and "<img" not in text and "\r" not in text and "\x1b" not in text
    assert "&lt;script&gt;" in text and "\\| pipe" in text


def test_ab_table_and_markdown_are_escaped():
    results = [{"label": "gemm [/x]", "status": "error", "message": HOSTILE[0] + " <b>|", "host": None,
                "device": None}]
    assert "[/m]" in _render(ab_table(results))
    md = ab_markdown(results)
    assert "&lt;b&gt;\\|" in md and "<b>" not in md


@pytest.mark.parametrize("width", [80, 100])
def test_the_ab_table_fits_and_keeps_numbers_whole(width):
    d = {"a_us": 10.123, "b_us": 9.87, "diff_us": -0.25, "ci_low_us": -0.3, "ci_high_us": -0.2, "verdict": "faster"}
    results = [{"label": "moe T=2048 E=256 k=8 H=7168 I=2048 natural", "status": "ok", "host": d, "device": d,
                "outputs": {"result": "same within bf16 bound (rel error 1.2e-3 <= 1e-2) and the end: THE-END"}}]
    out = _render(ab_table(results), width)
    assert max(len(line) for line in out.splitlines()) <= width
    assert "THE-END" in out and "10.12" in out and "9.87" in out and "faster" in out and "[-0.30," in out
