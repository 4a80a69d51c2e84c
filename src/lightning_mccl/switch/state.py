"""Where a running emulated switch is recorded, so `mccl switch down --tag T` (or `status`, `exec`) works from
another process than the one that brought it up.

One JSON file per tag in /run/mccl-switch (a tmpfs: like the namespaces themselves, it is gone after a
reboot). A file lock serialises `up` calls, so two of them never pick the same tag or subnet.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Dict, Iterator, Optional

DEFAULT_STATE_DIR = "/run/mccl-switch"
FORMAT = "mccl-switch/1"


def state_dir(path: Optional[str] = None) -> str:
    return path or DEFAULT_STATE_DIR


def state_path(tag: str, directory: Optional[str] = None) -> str:
    return os.path.join(state_dir(directory), f"{tag}.json")


@contextlib.contextmanager
def locked(directory: Optional[str] = None) -> Iterator[None]:
    d = state_dir(directory)
    os.makedirs(d, mode=0o755, exist_ok=True)
    with open(os.path.join(d, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write(tag: str, record: dict, directory: Optional[str] = None) -> None:
    path = state_path(tag, directory)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, **record}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read(tag: str, directory: Optional[str] = None) -> Optional[dict]:
    try:
        with open(state_path(tag, directory)) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{state_path(tag, directory)}: unreadable switch state ({e}); remove it by hand") from None
    if record.get("format") != FORMAT:
        raise ValueError(f"{state_path(tag, directory)}: format {record.get('format')!r}, expected {FORMAT!r}")
    return record


def remove(tag: str, directory: Optional[str] = None) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state_path(tag, directory))


def all_records(directory: Optional[str] = None) -> Dict[str, dict]:
    d = state_dir(directory)
    out = {}
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            tag = name[:-5]
            with contextlib.suppress(ValueError):
                record = read(tag, directory)
                if record is not None:
                    out[tag] = record
    return out
