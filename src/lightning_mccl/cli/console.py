"""Where the `mccl` command's own messages go: rich, on stderr (stdout carries the ranks' output and
`mccl doctor`'s tables)."""
from __future__ import annotations

import sys
from typing import Callable

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
