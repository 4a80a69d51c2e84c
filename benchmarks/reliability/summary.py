"""Summaries of trial records (fault_trials, garbage_trials) and the plain-text table faults.py prints."""
from __future__ import annotations

import statistics


def _pct(values, q):
    values = sorted(values)
    if not values:
        return None
    i = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[i]


def signal_summary(records: list) -> dict:
    """Kill or stop trials: how many passed, hung, and how fast and how clearly the survivors learned of it."""
    lat = [p["latency_s"] for r in records for p in r.get("survivors", {}).values() if p.get("raised")]
    survivors = [p for r in records for p in r.get("survivors", {}).values()]
    raised = [p for p in survivors if p.get("raised")]
    return {
        "trials": len(records),
        "passed": sum(r["ok"] for r in records),
        "hangs": sum(bool(r.get("hung")) for r in records),
        "setup_failures": sum("problem" in r for r in records),
        "worlds": sorted({r["world"] for r in records}),
        "survivors": len(survivors),
        "raised": len(raised),
        "latency_s": {"median": _round(statistics.median(lat)) if lat else None, "p95": _round(_pct(lat, 0.95)),
                      "max": _round(max(lat)) if lat else None},
        "limit_s": max((r["pg_timeout_s"] for r in records), default=0) + 2.0,
        "trials_all_within_1s": sum(r.get("max_latency_s") is not None and r["max_latency_s"] <= 1.0 and not r["hung"]
                                    for r in records),
        "name_rank": sum(p["names_rank"] for p in raised),
        "name_addr": sum(p["names_addr"] for p in raised),
        "dist_backend_error": sum(p["dist_error"] for p in raised),
        "later_call_raised": sum(p.get("later_call") == "raised" for p in raised),
        "destroy_ok": sum(p.get("destroy") == "ok" for p in raised),
        "failed": [_brief(r) for r in records if not r["ok"]][:10],
    }


def mismatch_summary(records: list) -> dict:
    by_kind = {}
    for r in records:
        by_kind.setdefault(r["mismatch"], []).append(r["verdict"] if "verdict" in r else r.get("problem", "?"))
    verdicts = [v for vs in by_kind.values() for v in vs]
    return {
        "trials": len(records),
        "passed": sum(r["ok"] for r in records),
        "detected": sum(v == "detected" for v in verdicts),
        "detected_late": sum(v.startswith("detected (") for v in verdicts),
        "undetected_correct": sum(v.startswith("undetected") for v in verdicts),
        "silent_wrong": sum(r.get("silent_wrong", 0) > 0 for r in records),
        "hangs": sum(r.get("hung", 0) > 0 for r in records),
        "by_kind": {k: sorted(set(v)) for k, v in sorted(by_kind.items())},
        "failed": [_brief(r) for r in records if not r["ok"]][:10],
    }


def garbage_summary(records: list) -> dict:
    out = {"trials": len(records), "passed": sum(r["ok"] for r in records), "connections": 0, "accepted": 0,
           "by_outcome": {}, "logged_by_ranks": 0, "reached_a_listener": 0,
           "rank_errors": sum(bool(r.get("rank_errors")) for r in records),
           "crashed_processes": sum(len(r.get("crashed", {})) for r in records),
           "same_result": sum(bool(r.get("same_result")) and isinstance(r.get("digest"), str) for r in records),
           "phases": {}, "failed": [_brief(r) for r in records if not r["ok"]][:5]}
    for r in records:
        for name, p in r.get("phases", {}).items():
            ph = out["phases"].setdefault(name, {"connections": 0, "by_outcome": {}})
            ph["connections"] += p["total"]
            out["connections"] += p["total"]
            out["accepted"] += p["accepted"]
            out["logged_by_ranks"] += p["logged_by_ranks"]
            out["reached_a_listener"] += p["reached_a_listener"]
            for k, v in p["by_outcome"].items():
                out["by_outcome"][k] = out["by_outcome"].get(k, 0) + v
                ph["by_outcome"][k] = ph["by_outcome"].get(k, 0) + v
    return out


def _round(x):
    return None if x is None else round(x, 3)


def _brief(r: dict) -> dict:
    keep = ("kind", "world", "op", "bytes", "victim", "mismatch", "verdict", "problem", "hung", "max_latency_s",
            "accepted", "rank_errors", "crashed", "same_result")
    out = {k: r[k] for k in keep if k in r}
    for rank, p in (r.get("survivors") or {}).items():
        if not (p.get("raised") and p.get("names_rank") and p.get("dist_error")):
            out.setdefault("survivors", {})[rank] = {k: v for k, v in p.items() if k != "message"} | {
                "message": (p.get("message") or "")[:300]}
    return out


def _outcomes(by_outcome: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items()))


def table(summary: dict) -> str:
    """The summary as the plain-text table the harness prints."""
    lines = []

    def row(name, value):
        lines.append(f"  {name:<34} {value}")

    for kind in ("kill", "stop"):
        s = summary.get(kind)
        if not s or not s["trials"]:
            continue
        lat = s["latency_s"]
        lines.append(f"{kind.upper()} trials (world sizes {s['worlds'][0]}-{s['worlds'][-1]})")
        row("passed", f"{s['passed']}/{s['trials']}  (hangs {s['hangs']}, setup failures {s['setup_failures']})")
        row("survivors that raised", f"{s['raised']}/{s['survivors']}")
        row("detection latency (s)", f"median {lat['median']}, p95 {lat['p95']}, max {lat['max']} "
                                     f"(limit: timeout + 2 = {s['limit_s']:g})")
        row("trials with every survivor < 1 s", f"{s['trials_all_within_1s']}/{s['trials']}")
        row("message names the victim's rank", f"{s['name_rank']}/{s['raised']}")
        row("message names its address", f"{s['name_addr']}/{s['raised']}")
        row("DistBackendError", f"{s['dist_backend_error']}/{s['raised']}")
        row("later call raised / destroy ok",
            f"{s['later_call_raised']}/{s['raised']} / {s['destroy_ok']}/{s['raised']}")
    s = summary.get("mismatch")
    if s and s["trials"]:
        lines.append("MISMATCH trials")
        row("passed", f"{s['passed']}/{s['trials']}")
        row("detected / late / undetected", f"{s['detected']} / {s['detected_late']} / {s['undetected_correct']}")
        row("silent wrong results / hangs", f"{s['silent_wrong']} / {s['hangs']}")
        for k, v in s["by_kind"].items():
            row(f"  {k}", ", ".join(v))
    for kind, title in (("garbage", "GARBAGE connections"), ("impersonation", "IMPERSONATION trials"),
                        ("stall", "STALLED-HANDSHAKE trials")):
        s = summary.get(kind)
        if not s or not s["trials"]:
            continue
        lines.append(title)
        row("trials passed", f"{s['passed']}/{s['trials']}")
        row("connections", f"{s['connections']} ({_outcomes(s['by_outcome'])})")
        for name, p in s["phases"].items():
            row(f"  during {name}", f"{p['connections']} ({_outcomes(p['by_outcome'])})")
        row("reached a listener / logged", f"{s['reached_a_listener']} / {s['logged_by_ranks']}")
        row("accepted", s["accepted"])
        row("trials with rank errors / crashed", f"{s['rank_errors']} / {s['crashed_processes']}")
        row("result unchanged", f"{s['same_result']}/{s['trials']}")
    return "\n".join(lines)
