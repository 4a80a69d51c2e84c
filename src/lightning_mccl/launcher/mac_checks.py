"""`mccl doctor`'s checks of a Mac's own settings, from the command outputs `host_probe` collected there:

- firewall: the application firewall (``socketfilterfw``: on, blocking all incoming, stealth mode) must let the
  ranks' Python accept its peers' connections (the prompt "accept incoming connections?" cannot be answered on a
  Mac reached over ssh); the rule names the Python's real file, not the virtual environment's link to it;
- sleep: a sleeping Mac drops out of the job and out of ssh;
- Xcode CLT: the command-line tools build lightning-mccl;
- display: the display-sleep setting (``pmset -g``: displaysleep), the displays attached (``system_profiler
  SPDisplaysDataType``), whether one is on now and what keeps it awake (``pmset -g assertions``: powerd holds
  "Prevent sleep while display is on" while it is), who is logged in at the console (``stat -f %Su
  /dev/console``; root: nobody). On macOS 26, sustained Metal work while a display is awake is killed with
  "Impacting Interactivity" or, on some Macs, panics and reboots them (ml-explore/mlx#3267, docs/macs.md);
- watchdog: a kernel panic report of the last days in /Library/Logs/DiagnosticReports (`host_probe.panic_reports`):
  a Mac that rebooted under the GPU watchdog says so there, and nowhere else;
- power: Low Power Mode and the power mode (``pmset -g``: lowpowermode, powermode 0 Automatic, 1 Low Power,
  2 High Power), and AC or battery (``pmset -g batt``): each cuts sustained GPU speed while the thermal state
  still reads nominal, so only a measured speed tells how much (`fleet_checks`);
- thermal: ``pmset -g therm`` (thermal and performance warning levels, the CPU speed limit);
- GPU load: ``ioreg -c IOAccelerator``'s "Device Utilization %" before anything of the job runs.

Each check returns a `Finding` (None where the Mac did not answer what it needs), with the command or Settings
pane that fixes it. `slow_causes` names which of these a slow Mac shows (`fleet_checks`' slow-Mac check).
"""
from __future__ import annotations

import json
import re
import shlex
from typing import List, Optional, Tuple

from ..straggler import SLOW_CAUSES
from .findings import FAIL, OK, WARN, Finding, command_output
from .host_probe import PANIC_DIR, RELAX_VAR, SOCKETFILTERFW
from .known_causes import RELAX, SLEEP_DISPLAY

POWER_MODES = {0: "Automatic", 1: "Low Power", 2: "High Power"}  # pmset's powermode
BUSY_GPU_PERCENT = 50  # the GPU busier than this before the job starts: another program uses it
DISPLAY_ON = "Prevent sleep while display is on"  # powerd's assertion while a display is on
WATCHDOG_PANIC = re.compile(r"watchdog|AGX|IOGPU|GPU", re.IGNORECASE)

def pmset_value(text: str, key: str) -> Optional[int]:
    """The number after `key` in ``pmset -g``'s settings (e.g. ``displaysleep 10``), or None."""
    m = re.search(rf"^\s*{re.escape(key)}\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def _text(probe: dict, name: str) -> Optional[str]:
    got = command_output(probe, name)
    return got[1] if got is not None and got[0] == 0 else None


def allow_command(probe: dict) -> str:
    """The commands that let a host's ranks' Python through its application firewall."""
    py = shlex.quote(probe.get("binary") or probe.get("executable") or "PYTHON")
    return f"sudo {SOCKETFILTERFW} --add {py} && sudo {SOCKETFILTERFW} --unblockapp {py}"


def _says_on(text: Optional[str]) -> bool:
    """Whether a socketfilterfw --get... answer says the setting is on ("... enabled", "... is on")."""
    return bool(text) and re.search(r"\b(enabled|on)\b", text, re.IGNORECASE) is not None and \
        re.search(r"\b(disabled|off)\b", text, re.IGNORECASE) is None


def check_firewall(host: str, probe: dict) -> Finding:
    got = command_output(probe, "firewall")
    if got is None:
        return Finding(host, "firewall", WARN, f"{SOCKETFILTERFW} did not answer", None)
    if "disabled" in got[1] or "State = 0" in got[1]:
        return Finding(host, "firewall", OK, "application firewall off")
    py = probe.get("binary") or probe.get("executable") or "PYTHON"
    if _says_on(_text(probe, "blockall")):
        return Finding(host, "firewall", FAIL, "application firewall on and blocking all incoming connections: peers "
                       "cannot connect to its ranks", f"sudo {SOCKETFILTERFW} --setblockall off")
    quiet = "; stealth mode on: a connection it blocks is dropped, and a peer waits for its timeout" if _says_on(_text(probe, "stealth")) else ""
    app = command_output(probe, "firewall_app")
    text = app[1] if app else ""
    if "permitted" in text:
        return Finding(host, "firewall", OK, f"application firewall on, {py} allowed{quiet}")
    why = "blocks" if "blocked" in text else "has no rule for"
    return Finding(host, "firewall", FAIL, f"application firewall on and {why} {py}: peers cannot connect to "
                   f"its ranks (the allow prompt cannot be answered over ssh){quiet}", allow_command(probe))


def check_sleep(host: str, probe: dict) -> Finding:
    minutes = pmset_value(_text(probe, "pmset") or "", "sleep")
    if minutes is None:
        return Finding(host, "sleep", WARN, "`pmset -g` did not say", None)
    if minutes == 0:
        return Finding(host, "sleep", OK, "system sleep off")
    return Finding(host, "sleep", WARN, f"sleeps after {minutes} min idle (kept awake during a job by "
                   "--caffeinate, but a sleeping Mac is unreachable between jobs)", "sudo pmset -a sleep 0")


def check_xcode(host: str, probe: dict) -> Finding:
    text = _text(probe, "xcode")
    if text and text.strip():
        return Finding(host, "Xcode CLT", OK, text.strip())
    return Finding(host, "Xcode CLT", WARN, "command-line tools missing (needed to build lightning-mccl)",
                   "xcode-select --install")


def displays(probe: dict) -> Optional[List[str]]:
    """The names of the displays attached (system_profiler's JSON), or None where it did not say."""
    text = _text(probe, "displays")
    if text is None:
        return None
    try:
        gpus = json.loads(text).get("SPDisplaysDataType") or []
    except (ValueError, AttributeError):
        return None
    return [d.get("_name", "display") for gpu in gpus for d in gpu.get("spdisplays_ndrvs") or []]


def display_holders(text: str) -> List[str]:
    """The programs holding a PreventUserIdleDisplaySleep assertion (``pmset -g assertions``): "caffeinate (pid 12)"."""
    return [f"{name} (pid {pid})" for pid, name in
            re.findall(r"pid (\d+)\((.+?)\):[^\n]*\bPreventUserIdleDisplaySleep\b", text)]


def console_user(probe: dict) -> Optional[str]:
    """The user logged in at the Mac's screen; "" when nobody is (the login window: /dev/console is root's)."""
    text = _text(probe, "console")
    if text is None:
        return None
    user = text.strip()
    return "" if user in ("root", "") else user


def check_display(host: str, probe: dict) -> Optional[Finding]:
    settings, assertions = _text(probe, "pmset"), _text(probe, "assertions")
    if settings is None and assertions is None:
        return None
    attached = displays(probe)
    minutes = pmset_value(settings or "", "displaysleep")
    on = DISPLAY_ON in assertions if assertions is not None else None
    holders = display_holders(assertions or "")
    user = console_user(probe)
    parts = [f"{len(attached)} display{'s' if len(attached) != 1 else ''} attached"
             + (f" ({', '.join(attached)})" if attached else " (headless)") if attached is not None else
             "displays attached unknown",
             {True: "on now", False: "off now", None: "on or off: unknown"}[on],
             "never sleeps (displaysleep 0)" if minutes == 0 else
             f"sleeps after {minutes} min idle" if minutes else "display sleep unknown",
             "nobody logged in at the console" if user == "" else f"{user} logged in at the console" if user else ""]
    if holders:
        parts.append(f"kept awake by {', '.join(holders)}")
    if probe.get("relax_watchdog"):
        parts.append(f"{RELAX_VAR}={probe['relax_watchdog']}")
    detail = "; ".join(p for p in parts if p)
    if attached == [] and not on:
        return Finding(host, "display", OK, detail + ": no awake display, which macOS 26's GPU watchdog needs")
    risk = ": on macOS 26 sustained GPU work while a display is awake is killed (\"Impacting Interactivity\") or " \
           "panics the Mac"
    if holders:
        return Finding(host, "display", WARN, detail + risk,
                       f"quit {', '.join(holders)} before training ({SLEEP_DISPLAY}); last resort: {RELAX}")
    if minutes == 0:
        return Finding(host, "display", WARN, detail + risk,
                       f"sudo pmset -a displaysleep 1, and `pmset displaysleepnow` before training; last resort: {RELAX}")
    if on:
        return Finding(host, "display", WARN, detail + risk,
                       f"pmset displaysleepnow (on that Mac, right before training); last resort: {RELAX}")
    return Finding(host, "display", OK, detail)


def _ago(seconds: float) -> str:
    hours = max(0.0, seconds) / 3600
    return f"{hours:.0f} h ago" if hours < 48 else f"{hours / 24:.0f} days ago"


def check_watchdog(host: str, probe: dict) -> Optional[Finding]:
    panics = probe.get("panics")
    if panics is None:
        return None
    if isinstance(panics, str):
        return Finding(host, "watchdog", WARN, f"panic reports not readable ({panics})",
                       "run mccl doctor as a user of the admin group to see them")
    if not panics:
        return Finding(host, "watchdog", OK, "no kernel panic in the last days")
    now = probe.get("now") or panics[0][1]
    gpu = [p for p in panics if WATCHDOG_PANIC.search(p[2])]
    name, modified, excerpt = (gpu or panics)[0]
    what = f"{len(panics)} kernel panic{'s' if len(panics) != 1 else ''} in the last days, the latest " \
           f"{'watchdog ' if gpu else ''}one {_ago(now - modified)} ({name}: {excerpt})"
    if gpu:
        return Finding(host, "watchdog", FAIL, what + ": the Mac rebooted under the watchdog, as sustained GPU work "
                       "with an awake display does on macOS 26", f"{SLEEP_DISPLAY}; {RELAX}")
    return Finding(host, "watchdog", WARN, what + ": it rebooted", f"read {PANIC_DIR}/{name} on {host}")


# What fixes each cause of a slow Mac (straggler.SLOW_CAUSES' keys), as its check and the slow-Mac check say it.
FIXES = {
    "low_power": "sudo pmset -a lowpowermode 0",
    "low_power_mode": "sudo pmset -a powermode 0 (Automatic; 2: High Power)",
    "battery": "connect its power adapter (or System Settings > Battery > Energy Mode: High Power)",
    "thermal": "give it air (nothing on or against it, the room cool); `pmset -g therm` shows when it eases",
    "gpu_busy": "quit it (Activity Monitor: Window > GPU History shows the load)",
    "chip": "give it a smaller batch (lightning_mccl.straggler.propose_batch_sizes)",
}


def power_state(probe: dict) -> Tuple[Optional[int], Optional[int], Optional[bool]]:
    """(lowpowermode, powermode, on battery) as ``pmset -g`` and ``pmset -g batt`` say; None where they do not.
    A Mac with High Power Mode shows ``powermode`` (0 Automatic, 1 Low Power, 2 High Power), another
    ``lowpowermode`` (Apple's pmset.m)."""
    settings, batt = _text(probe, "pmset") or "", _text(probe, "batt")
    battery = None if batt is None else "'Battery Power'" in batt
    return pmset_value(settings, "lowpowermode"), pmset_value(settings, "powermode"), battery


def power_limit(probe: dict) -> Optional[Tuple[str, str]]:
    """(SLOW_CAUSES key, fix) of what the power settings cost in speed: Low Power Mode, or Automatic on battery."""
    low, mode, battery = power_state(probe)
    if low == 1:
        return "low_power", FIXES["low_power"]
    if mode == 1:
        return "low_power", FIXES["low_power_mode"]
    if battery and mode in (None, 0):
        return "battery", FIXES["battery"]
    return None


def check_power(host: str, probe: dict) -> Optional[Finding]:
    if _text(probe, "pmset") is None:
        return None
    low, mode, battery = power_state(probe)
    detail = "; ".join(p for p in (
        f"Low Power Mode {'on' if low else 'off'}" if low is not None else "",
        f"power mode {POWER_MODES.get(mode, mode)}" if mode is not None else "",
        {True: "on battery", False: "on AC power", None: ""}[battery]) if p) or "pmset -g names no power mode"
    limit = power_limit(probe)
    if limit is None:
        return Finding(host, "power", OK, detail)
    why = (": it caps sustained GPU speed while the thermal state still reads nominal (`mccl doctor --model M "
           "--batch B` measures by how much)") if limit[0] == "low_power" else \
        ": Automatic favours the battery over speed"
    return Finding(host, "power", WARN, detail + why, limit[1])


def thermal_warning(probe: dict) -> Optional[str]:
    """What ``pmset -g therm`` reports as a thermal limit now ("CPU speed limit 70%", "thermal warning level 2"),
    "" where it reports none, None where it did not answer."""
    text = _text(probe, "therm")
    if text is None:
        return None
    found = []
    m = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", text)
    if m and int(m.group(1)) < 100:
        found.append(f"CPU speed limit {m.group(1)}%")
    for kind, level in re.findall(r"(thermal|performance) warning level\s*[=:]?\s*(\d+)", text, re.IGNORECASE):
        if int(level) > 0:
            found.append(f"{kind.lower()} warning level {level}")
    return ", ".join(found)


def check_thermal(host: str, probe: dict) -> Optional[Finding]:
    warning = thermal_warning(probe)
    if warning is None:
        return None
    if warning:
        return Finding(host, "thermal", WARN, f"pmset -g therm: {warning}: macOS slows the Mac to cool it",
                       FIXES["thermal"])
    return Finding(host, "thermal", OK, "no thermal or performance warning (which Low Power Mode does not raise)")


def gpu_busy(probe: dict) -> Optional[int]:
    """The GPU's utilization before the job (percent), where it is BUSY_GPU_PERCENT or more; else None."""
    m = re.search(r'"Device Utilization %"\s*=\s*(\d+)', _text(probe, "gpu") or "")
    return int(m.group(1)) if m and int(m.group(1)) >= BUSY_GPU_PERCENT else None


def check_gpu_load(host: str, probe: dict) -> Optional[Finding]:
    m = re.search(r'"Device Utilization %"\s*=\s*(\d+)', _text(probe, "gpu") or "")
    if m is None:
        return None
    if gpu_busy(probe) is not None:
        return Finding(host, "GPU load", WARN, f"GPU {m.group(1)}% busy before anything of the job runs: another "
                       "program uses it, and the job shares it", FIXES["gpu_busy"])
    return Finding(host, "GPU load", OK, f"GPU {m.group(1)}% busy before the job")


def chip(probe: dict) -> Optional[str]:
    """The Mac's chip ("Apple M2 Ultra"), or None."""
    text = _text(probe, "chip")
    return text.strip() or None if text else None


def slow_causes(probe: dict, fleet_chip: Optional[str]) -> List[Tuple[str, str]]:
    """(cause, fix) for each cause of a slow Mac (straggler.SLOW_CAUSES) that its probe shows; `fleet_chip` is
    the chip most of the fleet has."""
    found = []
    limit = power_limit(probe)
    if limit is not None:
        found.append((SLOW_CAUSES[limit[0]], limit[1]))
    thermal = thermal_warning(probe)
    if thermal:
        found.append((f"{SLOW_CAUSES['thermal']} ({thermal})", FIXES["thermal"]))
    busy = gpu_busy(probe)
    if busy is not None:
        found.append((f"{SLOW_CAUSES['gpu_busy']} ({busy}% busy before the job)", FIXES["gpu_busy"]))
    mine = chip(probe)
    if mine and fleet_chip and mine != fleet_chip:
        found.append((f"{SLOW_CAUSES['chip']} ({mine}; most of the fleet: {fleet_chip})", FIXES["chip"]))
    return found
