"""Tables of results, for `mccl plan`, `mccl doctor` and the benchmarks: on stdout (rich) and as markdown. A
table is (column titles, rows of cells): the first column left-aligned, the others right-aligned, its key
(what the columns mean) before it, notes after it. Loads neither torch nor Lightning."""
from __future__ import annotations

import sys
from typing import List, Sequence, Tuple

from rich.console import Console

Table = Tuple[List[str], List[List[str]]]


def stdout_console() -> Console:
    """For tables: as wide as the terminal, or 160 columns when stdout is a file or a pipe (rich would
    otherwise squeeze the tables into 80)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Console(highlight=False, width=None if tty else 160)


def markdown_table(table: Table, notes: Sequence[str] = ()) -> str:
    cols, rows = table
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if notes:
        lines += [""] + list(notes)
    return "\n".join(lines) + "\n"


def print_table(title: str, table: Table, notes: Sequence[str] = (), key: Sequence[str] = ()) -> None:
    """The title, then `key` (what the columns mean), the table, and `notes`."""
    from rich.table import Table as RichTable

    cols, rows = table
    t = RichTable(title_justify="left")
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    out = stdout_console()
    out.print(title, highlight=False, markup=False)
    for k in key:
        out.print(k, highlight=False, markup=False)
    out.print(t)
    for n in notes:
        out.print(f"[dim]{n}[/]", highlight=False)
