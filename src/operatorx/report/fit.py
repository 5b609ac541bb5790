"""Tables that fit the terminal: numbers never split, long text wraps, and when even that does not
fit, the note column folds out of the table into lines below it, whole.

`FitTable` is a rich `Table` (callers and tests use it as one). At render time it measures its
own minimum width; if that is wider than the console, it renders itself without the fold column
and then prints each row's text for that column as `#<row>: <text>`, wrapped to the width.
`column_options(name)` gives the per-column settings the printers share: numbers and status words
never wrap (a header or a number split over two lines reads wrong), labels fold, the note takes
the room that is left and wraps at words.
"""

from __future__ import annotations

import copy
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text

__all__ = ["FitTable", "column_options", "NO_WRAP_COLUMNS"]

#: Columns whose cells are numbers or single words: never wrapped or folded.
NO_WRAP_COLUMNS = frozenset({"#", "status", "side", "latency_us", "busy_us", "span_us", "gaps_us", "host_us",
                             "TFLOP/s", "GB/s", "% peak", "rows", "state", "cases", "iqr_us",
                             "host A", "host B", "dev A", "dev B", "host", "device", "world", "skew_us"})


#: Columns kept at least as wide as their longest word, up to this many characters.
_WHOLE_TOKENS = {"case": 20, "host B−A [CI]": 8, "dev B−A [CI]": 8}


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def column_options(name: str) -> dict[str, Any]:
    """`add_column` keyword arguments for a column of this name."""
    if name in NO_WRAP_COLUMNS:
        return {"no_wrap": True}
    if name in ("note", "outputs, notes", "outputs", "message", "output vs public"):
        return {"overflow": "fold", "ratio": 3, "min_width": 16}
    if name == "case":
        return {"overflow": "fold", "ratio": 2, "min_width": 10}
    return {"overflow": "fold", "ratio": 1, "min_width": 6}


def _natural(column: Column) -> int:
    return max([len(_plain(column.header)), *(len(line) for cell in column.cells for line in _plain(cell).split("\n"))])


def _fits(table: Table, console: Console, options: ConsoleOptions) -> bool:
    """Whether rich lays the table out within the width without cutting a no-wrap column."""
    if table.__rich_measure__(console, options).minimum > options.max_width:
        return False
    extra = table._extra_width
    widths = table._calculate_column_widths(console, options.update_width(options.max_width - extra))
    if sum(widths) + extra > options.max_width:
        return False
    pad = 2 if not table.collapse_padding else 1
    return all(w - pad >= _natural(c) for w, c in zip(widths, table.columns, strict=True) if c.no_wrap)


def _squeeze(table: Table, max_width: int) -> None:
    """Fixed widths that fit `max_width`: no-wrap columns whole, the others share what is left
    in proportion to what they would like, each at least its min_width. A lighter box too."""
    table.box, table.pad_edge, table.show_edge, table.collapse_padding = box.SIMPLE_HEAD, False, False, True
    n = len(table.columns)
    room = max_width - 2 * (n - 1)          # between two columns: one padding space and the divider
    flex = [c for c in table.columns if not c.no_wrap]
    room -= sum(_natural(c) for c in table.columns if c.no_wrap)
    wants = {id(c): _natural(c) for c in flex}
    if not flex or room >= sum(wants.values()):
        return
    mins = {id(c): min(wants[id(c)], c.min_width or 4) for c in flex}
    spare = max(0, room - sum(mins.values()))
    extra = sum(wants[id(c)] - mins[id(c)] for c in flex) or 1
    for c in flex:
        c.ratio = None
        c.width = mins[id(c)] + spare * (wants[id(c)] - mins[id(c)]) // extra


class FitTable(Table):
    """A Table that folds `fold_column` out below itself when it cannot fit the console."""

    fold_column: str = "note"
    _folded: bool = False

    def _keep_tokens_whole(self) -> FitTable:
        """A copy whose `case` column is at least as wide as its longest word (`4096x4096x4096`)."""
        table = copy.copy(self)
        table.columns = [copy.copy(c) for c in self.columns]
        for column in table.columns:
            if str(column.header) in _WHOLE_TOKENS:
                longest = max((len(w) for cell in column.cells for w in _plain(cell).split()), default=0)
                column.min_width = max(column.min_width or 0, min(longest, _WHOLE_TOKENS[str(column.header)]))
        table._folded = True
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self._folded:
            yield from super().__rich_console__(console, options)
            return
        table = self._keep_tokens_whole()
        names = [str(c.header) for c in table.columns]
        if self.fold_column not in names or _fits(table, console, options):
            yield table
            return
        at = names.index(self.fold_column)
        narrow = copy.copy(table)
        narrow.columns = [c for i, c in enumerate(table.columns) if i != at]
        if not _fits(narrow, console, options):
            _squeeze(narrow, options.max_width)
        yield narrow
        index_cells = list(self.columns[0].cells) if self.columns else []
        for i, cell in enumerate(self.columns[at].cells):
            text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
            if not text.plain.strip():
                continue
            label = index_cells[i] if i < len(index_cells) else str(i)
            label_text = label if isinstance(label, Text) else Text.from_markup(str(label))
            yield Text.assemble("#", label_text, ": ", text)
