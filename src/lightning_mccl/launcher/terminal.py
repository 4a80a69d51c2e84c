"""A rank's text as the launcher's stream can show it. Ranks told that their output is "terminal compatible"
(`progress`) write colours (SGR escape sequences) and redraw their progress bars in place (a carriage return,
an erase-line sequence, the bar; cursor hide and show around it). Among every rank's prefixed lines only the
colours are kept, and only on a terminal; the other control sequences would move the cursor over other
ranks' lines. `clip` cuts a line to the terminal's width by what it shows, not by its escape sequences, so
that a redrawn line never wraps."""
from __future__ import annotations

import re
import shutil
from typing import TextIO

# An ANSI control sequence (CSI ... final byte), or a two-byte escape such as ESC 7.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
RESET = "\x1b[0m"
ERASE_TO_END = "\x1b[K"


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def columns(stream: TextIO, default: int = 120) -> int:
    """The width of the terminal `stream` writes to, else `default`."""
    try:
        return shutil.get_terminal_size((default, 24)).columns if is_terminal(stream) else default
    except (OSError, ValueError):
        return default


def shown(text: str, colour: bool) -> str:
    """`text` without its control sequences but, when `colour`, its colours (SGR, the sequences ending in m)."""
    return _ESCAPE.sub(lambda m: m.group(0) if colour and m.group(0).endswith("m") and m.group(0)[1] == "[" else "",
                       text)


def visible(text: str) -> str:
    """What `text` shows: no escape sequence at all."""
    return _ESCAPE.sub("", text)


def clip(text: str, width: int) -> str:
    """`text` cut after `width` visible characters (escape sequences kept and not counted)."""
    out, count, pos = [], 0, 0
    for m in _ESCAPE.finditer(text):
        piece = text[pos:m.start()]
        if count + len(piece) >= width:
            out.append(piece[:max(0, width - count)])
            return "".join(out)
        out += [piece, m.group(0)]
        count += len(piece)
        pos = m.end()
    out.append(text[pos:][:max(0, width - count)])
    return "".join(out)
