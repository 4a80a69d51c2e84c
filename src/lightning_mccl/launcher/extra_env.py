"""The variables a job adds to every rank's environment (`mccl launch --env NAME[=VALUE]`), and the warning
for a secret-looking one given with its value: that value is on the launcher's command line, where `ps`
shows it to every user of the machine. ``--env NAME`` takes the value from the launcher's environment
instead, and keeps it off every command line."""
from __future__ import annotations

import os
import re
from typing import Callable, List, Mapping, Optional, Sequence

from .launch_plan import LaunchError

# An --env NAME=VALUE whose NAME matches this gets a warning: its value is on the launcher's command line.
SECRET_NAME = re.compile(r"SECRET|TOKEN|KEY|PASSWORD|PASS", re.IGNORECASE)


def parse_env(items: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> dict:
    """{name: value} of --env `items` (NAME=VALUE, or NAME: its value in `environ`, default os.environ);
    LaunchError for a bad name or an unset NAME."""
    environ = os.environ if environ is None else environ
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--env {item!r}: {name!r} is not a variable name")
        if not sep:
            if name not in environ:
                raise LaunchError(f"--env {name}: {name} is not set here (use --env {name}=VALUE)")
            value = environ[name]
        out[name] = value
    return out


def secret_names_with_values(items: Sequence[str]) -> List[str]:
    """The names in --env `items` given as NAME=VALUE that look like secrets (SECRET_NAME)."""
    return [name for name, sep, _ in (item.partition("=") for item in items) if sep and SECRET_NAME.search(name)]


def warn_secret_values(items: Sequence[str], log: Callable[[str], None]) -> None:
    """Logs, for each secret-looking --env NAME=VALUE, that the value is on the command line (never the value)."""
    for name in secret_names_with_values(items):
        log(f"warning: --env {name}=... puts the value of {name} on this command line, where `ps` shows it to every "
            f"user of this machine; export {name} and give --env {name} instead")
