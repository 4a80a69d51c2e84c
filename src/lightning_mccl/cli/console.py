"""Where the `mccl` command's own messages go: rich, on stderr (stdout carries the ranks' output and
`mccl doctor`'s tables); and tables of results, on stdout and as markdown (`mccl plan`, the benchmarks). A
table is (column titles, rows of cells): the first column left-aligned, the others right-aligned, notes
after it."""
from __future__ import annotations

import sys
from typing import Callable, List, Sequence, Tuple

from rich.console import Console
from rich.markup import escape


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    """For tables: as wide as the terminal, or 160 columns when stdout is a file or a pipe (rich would
    otherwise squeeze the tables into 80)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Console(highlight=False, width=None if tty else 160)


def make_log(console: Console, name: str = "mccl") -> Callable[[str], None]:
    def log(message: str) -> None:
        console.print(f"[bold cyan]{name}[/]: {escape(message)}")

    return log


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
