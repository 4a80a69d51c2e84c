"""Where the `mccl` command's own messages go: rich, on stderr (stdout carries the ranks' output and the
tables, `lightning_mccl.tables`)."""
from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.markup import escape


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def make_log(console: Console, name: str = "mccl") -> Callable[[str], None]:
    def log(message: str) -> None:
        console.print(f"[bold cyan]{name}[/]: {escape(message)}")

    return log
