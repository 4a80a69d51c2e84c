"""Fault-injection trials: SIGKILL or SIGSTOP one rank at a random point of a stream of collectives, or have
one rank call a different collective, and check what every other rank sees.

A kill/stop trial passes when every surviving rank
  (a) raised within the process group's timeout + 2 s of the fault (the contract: a dead peer fails its
      neighbours at once and, through abort frames, everyone; a silent one fails them at the timeout),
  (b) raised an error whose message names the victim's rank (and, counted separately, its address),
  (c) did not hang: the harness waits at most timeout + 2 s + MARGIN_S, then kills everything;
and, after the error, a later call raised too and destroy_process_group() returned.

A mismatch trial passes when the mismatch was detected: every rank raised, at the mismatched call or (a
rank that could finish its part first, such as a broadcast's root) at its next collective, within the
timeout + 2 s. Its record also says whether any rank returned a wrong result (at the call, or in the
collectives after it) or hung; "undetected, results correct" is a failed trial whose results were still
right for each rank's own call.
"""
from __future__ import annotations

import os
import re
import signal
import tempfile

from lightning_mccl.testing import Cluster, now
from .fault_ranks import loop_until_error, mismatch_call

# Allowed by the acceptance criterion beyond the process-group timeout.
SLACK_S = 2.0
# Extra time the harness waits beyond timeout + SLACK_S before calling it a hang.
MARGIN_S = 3.0
# A trial's ranks must have joined and completed a first collective within this (else: a setup failure).
STARTUP_LIMIT_S = 60.0


def names_rank(message: str, rank: int) -> bool:
    return re.search(rf"\brank {rank}\b", message) is not None


def _tail_log(path, limit=4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


def fault_trial(*, world: int, op: str, n: int, fault: str, victim: int, delay_s: float, pg_timeout_s: float,
                log_dir: str | None = None) -> dict:
    """One kill ("kill") or stop ("stop") trial; returns its record (see module doc for the checks)."""
    sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[fault]
    rec = {"kind": fault, "world": world, "op": op, "bytes": 4 * n, "victim": victim, "delay_s": round(delay_s, 3),
           "pg_timeout_s": pg_timeout_s}
    # As in production (heartbeat timeout 30 s, process-group timeouts of minutes), the heartbeat timeout is
    # below the process-group timeout, so a stopped rank is named by the heartbeat rather than by a
    # collective timed out on whichever (live) neighbour a rank happened to be waiting for.
    env = {"MCCL_HEARTBEAT_TIMEOUT": f"{0.6 * pg_timeout_s:g}"}
    rec["heartbeat_timeout_s"] = 0.6 * pg_timeout_s
    log = tempfile.NamedTemporaryFile(prefix="mccl-fault-", suffix=".log", dir=log_dir, delete=False)
    log.close()
    max_s = STARTUP_LIMIT_S + delay_s + pg_timeout_s + SLACK_S + MARGIN_S
    with Cluster(loop_until_error, world, pg_timeout_s=pg_timeout_s, kwargs=dict(op=op, n=n, max_s=max_s),
                 stderr_path=log.name, env=env) as c:
        t_start = now()
        if not c.wait_until(lambda c: c.ranks_with("looping") | c.ranks_with("uncaught") >= set(range(world)),
                            t_start + STARTUP_LIMIT_S) or c.ranks_with("uncaught") or c.ranks_with("error"):
            rec.update(ok=False, problem="setup: the ranks did not all start looping",
                       events=_brief(c.events), log=_tail_log(log.name))
            os.unlink(log.name)
            return rec
        rec["startup_s"] = round(now() - t_start, 3)
        c.poll(delay_s)
        victim_addr = c.listen_address(victim)
        t_fault = c.signal(victim, sig)
        survivors = [r for r in range(world) if r != victim]
        deadline = t_fault + pg_timeout_s + SLACK_S + MARGIN_S
        done = lambda c: all(c.latest(r, "after") or c.latest(r, "uncaught") or c.latest(r, "no_error")  # noqa: E731
                             or c.exited(r) for r in survivors)
        c.wait_until(done, deadline)
        hung = [r for r in survivors if c.latest(r, "error") is None]
        per_rank = {}
        for r in survivors:
            e = c.latest(r, "error")
            a = c.latest(r, "after") or {}
            if e is None:
                per_rank[r] = {"raised": False, "state": _state(c, r)}
                continue
            per_rank[r] = {
                "raised": True, "latency_s": round(e["t"] - t_fault, 3), "type": e["type"],
                "dist_error": e["dist_error"], "message": e["message"],
                "names_rank": names_rank(e["message"], victim),
                "names_addr": bool(victim_addr) and victim_addr in e["message"],
                "later_call": a.get("later_call"), "later_call_s": _r(a.get("later_call_s")),
                "destroy": a.get("destroy"), "destroy_s": _r(a.get("destroy_s")),
            }
        wrong = [f for r, k, f in c.events if k == "wrong"]
    limit = pg_timeout_s + SLACK_S
    raised = [p for p in per_rank.values() if p["raised"]]
    rec.update(
        victim_addr=victim_addr,
        survivors=per_rank,
        hung=hung,
        max_latency_s=max((p["latency_s"] for p in raised), default=None),
        all_within_limit=not hung and all(p["latency_s"] <= limit for p in raised),
        all_name_rank=not hung and all(p["names_rank"] for p in raised),
        all_name_addr=not hung and all(p["names_addr"] for p in raised),
        all_dist_error=not hung and all(p["dist_error"] for p in raised),
        later_calls_raise=all(p["later_call"] == "raised" for p in raised),
        destroy_ok=all(p["destroy"] == "ok" for p in raised),
        wrong_results=wrong,
    )
    rec["ok"] = bool(rec["all_within_limit"] and rec["all_name_rank"] and rec["all_dist_error"]
                     and rec["later_calls_raise"] and rec["destroy_ok"] and not wrong and not hung)
    if not rec["ok"]:
        rec["log"] = _tail_log(log.name)
    os.unlink(log.name)
    return rec


def mismatch_trial(*, world: int, kind: str, victim: int, n: int, pg_timeout_s: float, warmup: int = 2,
                   log_dir: str | None = None) -> dict:
    rec = {"kind": "mismatch", "mismatch": kind, "world": world, "bytes": 4 * n, "victim": victim,
           "pg_timeout_s": pg_timeout_s}
    log = tempfile.NamedTemporaryFile(prefix="mccl-mismatch-", suffix=".log", dir=log_dir, delete=False)
    log.close()
    with Cluster(mismatch_call, world, pg_timeout_s=pg_timeout_s,
                 kwargs=dict(kind=kind, victim=victim, n=n, warmup=warmup), stderr_path=log.name) as c:
        t0 = now()
        if not c.wait_until(lambda c: c.ranks_with("calling") | c.ranks_with("uncaught") >= set(range(world)),
                            t0 + STARTUP_LIMIT_S) or c.ranks_with("uncaught"):
            rec.update(ok=False, problem="setup: the ranks did not all reach the mismatched call",
                       events=_brief(c.events), log=_tail_log(log.name))
            os.unlink(log.name)
            return rec
        t_call = max(f["t"] for r, k, f in c.events if k == "calling")
        deadline = t_call + pg_timeout_s + SLACK_S + MARGIN_S
        c.wait_until(lambda c: all(c.latest(r, "after") or c.latest(r, "returned") or c.latest(r, "uncaught")
                                   for r in range(world)), deadline)
        per_rank = {}
        for r in range(world):
            e, ret = c.latest(r, "error"), c.latest(r, "returned")
            if e is not None:
                a = c.latest(r, "after") or {}
                per_rank[r] = {"outcome": "raised", "latency_s": round(e["latency_s"], 3), "type": e["type"],
                               "dist_error": e["dist_error"], "message": e["message"],
                               "says_mismatch": bool(re.search(r"mismatch", e["message"], re.I)),
                               "later_call": a.get("later_call")}
            elif ret is not None:
                per_rank[r] = {"outcome": _returned_outcome(ret), "latency_s": round(ret["latency_s"], 3),
                               "wrong": ret["wrong"], "follow_up": ret["follow_up"]}
            else:
                per_rank[r] = {"outcome": "hung", "state": _state(c, r)}
        for r in range(world):
            c.tell(r, "exit")
        c.poll(0.2)
    outcomes = [p["outcome"] for p in per_rank.values()]
    rec["ranks"] = per_rank
    rec["silent_wrong"] = sum("WRONG" in o for o in outcomes)
    rec["hung"] = outcomes.count("hung")
    rec["all_raised"] = all(o == "raised" for o in outcomes)
    rec["within_limit"] = all(p.get("latency_s", 0) <= pg_timeout_s + SLACK_S for p in per_rank.values())
    if rec["silent_wrong"]:
        verdict = "SILENT WRONG"
    elif rec["hung"]:
        verdict = "HANG"
    elif rec["all_raised"]:
        verdict = "detected"
    elif all(o in ("raised", "raised at its next call") for o in outcomes):
        verdict = "detected (some ranks at their next call)"
    elif all(o == "returned correct" for o in outcomes):
        verdict = "undetected, results correct"
    else:
        verdict = "partly detected"
    rec["verdict"] = verdict
    rec["detected"] = verdict.startswith("detected")
    rec["ok"] = rec["detected"] and rec["within_limit"]
    if not rec["ok"]:
        rec["log"] = _tail_log(log.name)
    os.unlink(log.name)
    return rec


def _returned_outcome(ret: dict) -> str:
    follow = ret["follow_up"]["outcome"]
    if ret["wrong"] is not None or follow == "wrong":
        return "returned WRONG"
    return "raised at its next call" if follow == "raised" else "returned correct"


def _state(c: Cluster, r: int) -> str:
    if c.latest(r, "uncaught"):
        f = c.latest(r, "uncaught")
        return f"raised {f['type']}: {f['message'][:300]}"
    if c.latest(r, "no_error"):
        return "kept completing collectives without an error"
    if c.exited(r):
        return f"exited with code {c.exitcode(r)} without reporting"
    return "still blocked at the deadline (killed)"


def _r(x):
    return None if x is None else round(x, 3)


def _brief(events) -> list:
    return [(r, k, {kk: (vv[:300] if isinstance(vv, str) else vv) for kk, vv in f.items() if kk != "traceback"})
            for r, k, f in events][-30:]
