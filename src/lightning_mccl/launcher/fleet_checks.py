"""`mccl doctor`'s checks of what its measurement (`doctor_bench`) found, with each host's probe (`host_probe`) to
say why:

- connections: every rank connects to every other from the ranks' own Python (`doctor_reach`) before anything
  else runs. A Mac whose Local Network privacy denies that Python gets "No route to host" (EHOSTUNREACH) at
  once for a peer on its own network, while its router and the internet still answer (Apple's TN3179); a peer's
  application firewall refuses the connection, or, in stealth mode, drops it (a timeout). Each failure is named
  with its likely cause and the Settings pane or command that fixes it, instead of a rendezvous timeout later;
- speed: with ``mccl doctor --model M --batch B``, every Mac's samples/s on its training device
  (`doctor_speed`); a Mac below SLOW_FRACTION of the fleet's median is named with what its probe shows of the
  usual causes (`mac_checks.slow_causes`: Low Power Mode, Automatic power mode on battery, a thermal limit,
  another program on the GPU, an older chip).

`hosts` and `setups` are per rank of the measurement (one rank a host): the host's name and its probe's
setup (None where it has none).
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Sequence

from .findings import FAIL, OK, WARN, Finding
from .mac_checks import allow_command, chip, slow_causes

SLOW_FRACTION = 0.8  # a Mac below this fraction of the fleet's median samples/s is named
LOCAL_NETWORK_PANE = "System Settings > Privacy & Security > Local Network"


def _darwin(setup: Optional[dict]) -> bool:
    return bool(setup) and setup.get("system") == "Darwin"


def _why(kind: str, source: str, target: str, src: Optional[dict], dst: Optional[dict]) -> tuple:
    """(likely cause, fix) of connections from `source` to `target` that failed with errno name `kind`."""
    if kind == "EHOSTUNREACH" and _darwin(src):
        return (f"macOS's Local Network privacy on {source} most likely denies its Python ({(src or {}).get('binary')})"
                f" the local network (the router and the internet still answer)",
                f"on {source}: {LOCAL_NETWORK_PANE}: turn on the Python the ranks run (or the app they are started "
                f"from), then run mccl doctor again")
    if kind in ("ECONNREFUSED", "timeout") and _darwin(dst):
        how = "refuses it" if kind == "ECONNREFUSED" else "drops it (stealth mode)"
        return (f"{target}'s application firewall most likely {how}", allow_command(dst))
    if kind == "timeout":
        return (f"something between them drops the connection (a firewall on {target} or on the network)",
                f"let TCP from {source} to {target} through (`mccl launch --port-range` keeps the ports few)")
    if kind in ("EHOSTUNREACH", "ENETUNREACH"):
        return (f"{source} has no route to {target}", "check both hosts' addr and ifname in the hostfile")
    return (f"{target} refuses it" if kind == "ECONNREFUSED" else kind,
            f"check that nothing on {target} or between them rejects TCP from {source}")


def check_connections(hosts: Sequence[str], setups: Sequence[Optional[dict]], failures: Sequence[dict]
                      ) -> List[Finding]:
    """One FAIL per host and kind of failure: which peers it could not connect to, why, and the fix."""
    grouped: Dict[tuple, List[dict]] = defaultdict(list)
    for f in failures:
        grouped[(f["from"], f["kind"])].append(f)
    found = []
    for (source, kind), items in sorted(grouped.items()):
        targets = sorted({f["to"] for f in items})
        cause, fix = _why(kind, hosts[source], hosts[targets[0]], setups[source], setups[targets[0]])
        peers = ", ".join(f"{hosts[t]} ({next(f['addr'] for f in items if f['to'] == t)})" for t in targets[:4])
        more = f" and {len(targets) - 4} more" if len(targets) > 4 else ""
        found.append(Finding(hosts[source], "connections", FAIL,
                             f"cannot connect to {len(targets)} of {len(hosts) - 1} peers ({peers}{more}): "
                             f"{items[0]['error']}; {cause}",
                             fix))
    return found


def median_rate(speeds: Sequence[dict]) -> float:
    """The fleet's median samples/s (0 where no rank timed its step)."""
    rates = [s["samples_per_s"] for s in speeds if s.get("samples_per_s")]
    return statistics.median(rates) if rates else 0.0


def check_speed(hosts: Sequence[str], setups: Sequence[Optional[dict]], speeds: Sequence[dict]) -> List[Finding]:
    """A WARN for each Mac below SLOW_FRACTION of the fleet's median samples/s (with its likely causes), and for
    each rank whose step failed; an OK for each of the others."""
    rates = [s["samples_per_s"] for s in speeds if s.get("samples_per_s")]
    median = median_rate(speeds)
    chips = Counter(c for c in (chip(s) for s in setups if s) if c)
    fleet_chip = chips.most_common(1)[0][0] if chips else None
    found = []
    for rank, s in enumerate(speeds):
        host = hosts[rank]
        if s.get("error"):
            found.append(Finding(host, "speed", WARN, f"the model step failed: {s['error']}",
                                 "check --model and --batch (mccl plan takes the same model names)"))
            continue
        detail = f"{s['samples_per_s']:.1f} samples/s on {s['device_name']}, {s['samples_per_s'] / median:.2f} of the " \
                 f"fleet's median ({median:.1f})"
        if len(rates) < 2 or s["samples_per_s"] >= SLOW_FRACTION * median:
            found.append(Finding(host, "speed", OK, detail))
            continue
        causes = slow_causes(setups[rank] or {}, fleet_chip)
        if causes:
            found.append(Finding(host, "speed", WARN, f"{detail}: slow; likely: {'; '.join(c for c, _ in causes)}",
                                 "; ".join(fix for _, fix in causes)))
        else:
            found.append(Finding(host, "speed", WARN, f"{detail}: slow, and none of the usual causes shows (Low Power "
                                 "Mode, battery, a thermal limit, a busy GPU, another chip)",
                                 "look for other work on it (Activity Monitor: GPU History), or give it a smaller "
                                 "batch (lightning_mccl.straggler.propose_batch_sizes)"))
    return found
