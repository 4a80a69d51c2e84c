"""Failures whose cause a rank's output names by itself, wherever in the output the line is, and what to do:
the launcher's last word on a failed job (`job.failure_line`) and `mccl doctor`'s report of a failed measurement
add it to the failed rank's first error (`error_line.RankTails` watches every line for them).

- GPU_WATCHDOG: macOS's GPU watchdog stopped a command buffer, "Impacting Interactivity"
  (``kIOGPUCommandBufferCallbackErrorImpactingInteractivity``, code 0000000e): on macOS 26, sustained Metal
  work while a display is awake. MLX raises it as a RuntimeError; torch's MPS prints it in its "command buffer
  exited with error status" message, where older releases printed the same code as "Internal Error
  (0000000e:Internal Error)". The two fixes and what each costs: docs/macs.md, *Long runs on macOS 26*;
- HOST_LOST: ssh lost its host mid-run ("Connection to HOST closed by remote host", "Timeout, server HOST not
  responding"): it rebooted (a Mac that panicked under the GPU watchdog does), slept, or left the network;
  `mccl doctor` then finds the panic report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .host_probe import RELAX_VAR

# Both fixes of the GPU watchdog, each with what it costs, as the launcher and `mccl doctor` (mac_checks) say them.
SLEEP_DISPLAY = "let the display sleep while it trains (`pmset displaysleepnow`, or run headless over ssh)"
RELAX = (f"`mccl launch --env {RELAX_VAR}=1` relaxes the GPU watchdog on most Macs, at a cost to the "
         f"responsiveness of the Mac's own screen (not on every Mac: keep the display asleep too)")


@dataclass(frozen=True)
class KnownCause:
    name: str
    pattern: "re.Pattern[str]"
    explain: str  # the cause and its fixes; {host}: where the rank ran


GPU_WATCHDOG = KnownCause(
    "macOS GPU watchdog",
    re.compile(r"Impacting ?Interactivity|ImpactingInteractivity|\(0000000e:"),
    "macOS's GPU watchdog stopped the GPU work of the rank on {host} (\"Impacting Interactivity\": on macOS 26 it "
    "kills sustained GPU work while a display is awake). Fix on {host}: " + SLEEP_DISPLAY + ": reliable, and it "
    "costs only the screen; or " + RELAX + ". `mccl doctor` checks every Mac's display")
HOST_LOST = KnownCause(
    "host lost",
    re.compile(r"Connection to \S+ closed by remote host|Timeout, server \S+ not responding|"
               r"client_loop: send disconnect"),
    "ssh lost {host} mid-run: it rebooted, slept or left the network. A Mac that panicked under macOS 26's GPU "
    "watchdog reboots: `mccl doctor` reports the panic")
CAUSES = (GPU_WATCHDOG, HOST_LOST)


def known_cause(line: str) -> Optional[KnownCause]:
    """The cause `line` names, or None."""
    return next((c for c in CAUSES if c.pattern.search(line)), None)
