"""`results show --markdown`: links, images, autolinks and raw HTML in a row's text reach a Markdown viewer
as the text itself. Rendered with markdown-it-py (CommonMark + tables; rich depends on it, so it is always
here) and, where installed, with cmark-gfm (GitHub's renderer, with its autolink extension)."""

from __future__ import annotations

import html
import re

import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.report import rows_markdown
from operatorx.report.safe import md_cell, plain
from operatorx.store import Store
from tests.report.rows import make_row

ACTIVE = [
    "[click me](https://evil.example/steal?x=1)",
    "![tracker](https://evil.example/pixel.png)",
    "[ref link][1] and [1]: https://evil.example",
    "<https://evil.example/autolink> and <mail@evil.example>",
    "see https://evil.example/bare and http://x.example and www.evil.example/path",
    "<img src=x onerror=alert(1)><script>alert(2)</script><a href='https://e.example'>a</a>",
    "`code span` and ``double``",
    "a | pipe \\| and a trailing backslash \\",
    "ftp://files.example/x and HTTPS://UPPER.example",
]


def _cells(rendered: str) -> list[str]:
    """The body cells' HTML of a rendered one-column-per-cell table."""
    body = rendered.split("<tbody>", 1)[1]
    return re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)


def _table(values: list[str]) -> str:
    return "| text |\n|---|\n" + "".join(f"| {md_cell(v)} |\n" for v in values)


@pytest.mark.parametrize("value", ACTIVE)
def test_commonmark_shows_the_text_and_makes_no_element(value):
    rendered = MarkdownIt("commonmark").enable("table").render(_table([value]))
    (cell,) = _cells(rendered)
    assert "<" not in cell, cell                                  # no <a>, <img>, <code>, <script>: text only
    assert html.unescape(cell) == plain(value)                    # and exactly the text that was there


def test_a_whole_rows_table_renders_as_text():
    rows = [make_row("error", message=m, index=i) for i, m in enumerate(ACTIVE)]
    rendered = MarkdownIt("commonmark").enable("table").render(rows_markdown(rows))
    assert not re.search(r"<(a|img|script|code)\b", rendered), rendered
    assert len(re.findall(r"<tr>", rendered)) == 1 + len(rows)   # one table row per row: no cell broke out


def test_github_flavoured_markdown_links_no_url():
    cmarkgfm = pytest.importorskip("cmarkgfm", reason="cmark-gfm bindings not installed (pip install cmarkgfm)")
    from cmarkgfm.cmark import Options

    urls = [v for v in ACTIVE if "@" not in v]        # cmark-gfm links e-mail addresses whatever is escaped
    rendered = cmarkgfm.github_flavored_markdown_to_html(_table(urls), options=Options.CMARK_OPT_UNSAFE)
    cells = _cells(rendered)
    assert len(cells) == len(urls)
    for value, cell in zip(urls, cells, strict=True):
        assert "<" not in cell, (value, cell)
        assert html.unescape(cell) == plain(value)


def test_md_cell_escapes(tmp_path):
    assert md_cell("[t](http://x.example)") == "\\[t\\](http\\://x.example)"
    assert md_cell("![i](u)") == "!\\[i\\](u)"
    assert md_cell("www.x.example") == "www\\.x.example"
    assert md_cell("`x`") == "\\`x\\`"
    assert md_cell("gemm_perf q_proj 1x7168x2048") == "gemm_perf q_proj 1x7168x2048"     # ordinary text as it was


def test_results_show_markdown_prints_inert_links(tmp_path):
    db = str(tmp_path / "ox.db")
    store = Store(db)
    row = make_row("error", message="[x](https://evil.example) ![p](https://evil.example/p.png) <b>b</b>")
    store.begin_run("r1", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, [row])
    store.put_row("r1", row)
    store.close()
    r = CliRunner().invoke(app, ["results", "show", "r1", "--markdown", "--db", db])
    assert r.exit_code == 0, r.output
    rendered = MarkdownIt("commonmark").enable("table").render(r.output)
    assert not re.search(r"<(a|img|b)\b", rendered), rendered
    assert "[x](https://evil.example)" in html.unescape(rendered)
