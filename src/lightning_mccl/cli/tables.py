"""Tables of results: on stdout with rich (as wide as the terminal, or 160 columns into a file), and as
markdown for a results file. A table is (column titles, rows of cells); the first column is left-aligned,
the others right-aligned; notes follow it, dimmed."""
from __future__ import annotations

from typing import List, Sequence, Tuple

Table = Tuple[List[str], List[List[str]]]


def markdown_table(table: Table, notes: Sequence[str] = ()) -> str:
    cols, rows = table
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if notes:
        lines += [""] + list(notes)
    return "\n".join(lines) + "\n"


def print_table(title: str, table: Table, notes: Sequence[str] = ()) -> None:
    from rich.table import Table as RichTable

    from .console import stdout_console

    cols, rows = table
    t = RichTable(title=title, title_justify="left")
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    out = stdout_console()
    out.print(t)
    for n in notes:
        out.print(f"[dim]{n}[/]", highlight=False)
