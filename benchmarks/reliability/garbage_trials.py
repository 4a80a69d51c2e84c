"""Garbage trials: hostile connections to the mccl listen ports while a job rendezvouses and trains.

One trial: `world` ranks run garbage_ranks.train_gated. While all but the last rank wait in rendezvous
(listeners open), a Flood makes `rendezvous_connections` connections to their published addresses; then
the last rank joins, and while the job trains, another Flood makes `training_connections` connections to
every rank's address (outside rendezvous the engine keeps no listener open, so today these are refused).
The trial passes when
  - no rank crashed or raised, and every rank finished training (0 crashes),
  - no connection was accepted (kept open, or answered with more than the challenge: see `accepted`),
  - the trained weights equal, bit for bit, those of the same job without garbage (`reference`),
  - every collective checked during training was exact.
It also counts the connections the ranks logged (the engine logs every connection it closes, with the
client's address) and how long rendezvous took with the garbage.
"""
from __future__ import annotations

import os
import re
import tempfile

from lightning_mccl.testing import Cluster, find_mccl_key, now
from .garbage import BASIC_KINDS, Flood, Target, tally
from .garbage_ranks import train_gated

STEPS = 12
N = 4096
PHASE_LIMIT_S = 20.0


def _targets(c: Cluster, ranks, missing_rank, comm_id_box):
    def targets():
        out = []
        if comm_id_box[0] is None:
            key = find_mccl_key(c.store, "mccl/comm_id")
            if key is not None:
                comm_id_box[0] = int(c.store.get(key).decode())
        for r in ranks:
            addr = c.listen_address(r)
            if addr:
                host, port = addr.rsplit(":", 1)
                out.append(Target(host=host, port=int(port), rank=r, world=c.world, comm_id=comm_id_box[0] or 0,
                                  missing_rank=missing_rank))
        return out
    return targets


def _cached(fn):
    """targets() reads the store; once every rank's address is known, the answer no longer changes."""
    box = {"value": None, "n": -1}

    def wrapped():
        if box["value"] is not None:
            return box["value"]
        value = fn()
        if len(value) == box["n"] and value:
            box["value"] = value
        box["n"] = len(value)
        return value
    return wrapped


def garbage_trial(*, world: int, rendezvous_connections: int, training_connections: int, kinds=BASIC_KINDS,
                  seed: int = 0, pg_timeout_s: float = 30.0, reference: str | None = None, threads: int = 8,
                  log_dir: str | None = None) -> dict:
    rec = {"kind": "garbage", "world": world, "kinds": list(kinds), "seed": seed, "pg_timeout_s": pg_timeout_s}
    log = tempfile.NamedTemporaryFile(prefix="mccl-garbage-", suffix=".log", dir=log_dir, delete=False)
    log.close()
    gate = world - 1
    floods = []
    with Cluster(train_gated, world, pg_timeout_s=pg_timeout_s, kwargs=dict(steps=STEPS, n=N, gate_rank=gate),
                 stderr_path=log.name) as c:
        t0 = now()
        early = list(range(world - 1))
        ok = c.wait_until(lambda c: gate in c.ranks_with("waiting") or c.ranks_with("uncaught"), t0 + 60.0)
        ok = ok and c.wait_until(lambda c: all(c.listen_address(r) for r in early), t0 + 60.0)
        if not ok:
            return _setup_failure(rec, c, log.name, "the ranks never published their addresses")
        # Phase 1: rendezvous. Ranks 0..world-2 wait for the last rank; their listeners take the garbage.
        comm = [None]
        if rendezvous_connections and world > 1:
            flood = Flood(_cached(_targets(c, early, gate, comm)), rendezvous_connections, kinds=tuple(kinds),
                          seed=seed, threads=threads).start()
            floods.append(("rendezvous", flood))
            flood.join(PHASE_LIMIT_S)
            flood.stop()
            rec["rendezvous_flood_s"] = round(now() - t0, 3)
        t_go = now()
        c.tell(gate, "go")
        joined = c.wait_until(lambda c: len(c.ranks_with("joined") | c.ranks_with("uncaught")) == world,
                              t_go + pg_timeout_s + 5.0)
        rec["rendezvous_after_go_s"] = round(now() - t_go, 3)
        # Phase 2: training. Every rank's address, listener open or not.
        if joined and training_connections:
            flood = Flood(_cached(_targets(c, range(world), None, comm)), training_connections,
                          kinds=tuple(k for k in kinds if k != "stall"), seed=seed + 1, threads=threads).start()
            floods.append(("training", flood))
            flood.join(PHASE_LIMIT_S)
            flood.stop()
        c.tell(0, "finish")
        c.wait_until(lambda c: len(c.ranks_with("trained") | c.ranks_with("uncaught")) == world
                     or any(c.exited(r) and r not in c.ranks_with("trained") for r in range(world)),
                     now() + pg_timeout_s + 5.0)
        c.poll(0.1)
        for _, flood in floods:  # stalled connections were held until now: through rendezvous and training
            flood.release()
        # a rank that was blocked by a stalled connection reports only now
        c.wait_until(lambda c: all(c.exited(r) for r in range(world)), now() + 10.0)
        c.poll(0.1)
        trained = {r: c.latest(r, "trained") for r in range(world)}
        rank_errors = {r: c.latest(r, "uncaught")["message"][:500] for r in range(world) if c.latest(r, "uncaught")}
        # A process that ended without reporting (a signal, a native crash), or died by a signal after it did.
        crashed = {r: f"exit code {c.exitcode(r)}" for r in range(world)
                   if (trained[r] is None and r not in rank_errors) or (c.exitcode(r) or 0) < 0}
        digests = {f["digest"] for f in trained.values() if f}
        wrong = [w for f in trained.values() if f for w in f["wrong"]]
        init_s = [f["init_s"] for r, k, f in c.events if k == "joined"]
    with open(log.name, errors="replace") as f:
        log_text = f.read()
    os.unlink(log.name)
    phases = _phases(floods, log_text)
    rec["phases"] = phases
    rec["connections"] = sum(p["total"] for p in phases.values())
    rec["accepted"] = sum(p["accepted"] for p in phases.values())
    # why the ranks closed each connection they logged (the handshake's reason, after the client's address)
    rec["rejected_for"] = sorted({m.group(1)[:160] for m in re.finditer(
        r"closed a connection from \S+?(?: \(it said it is rank \d+\))?: (.*)", log_text)})
    rec["rank_errors"] = rank_errors
    rec["crashed"] = crashed
    rec["max_init_s"] = round(max(init_s), 3) if init_s else None
    rec["digest"] = digests.pop() if len(digests) == 1 and len(trained) == world and all(trained.values()) \
        else sorted(digests)
    rec["reference"] = reference
    rec["same_result"] = reference is None or rec["digest"] == reference
    rec["wrong"] = wrong
    rec["ok"] = (not rank_errors and not crashed and rec["accepted"] == 0 and isinstance(rec["digest"], str)
                 and rec["same_result"] and not wrong)
    if not rec["ok"]:
        rec["log"] = log_text[-4000:]
    return rec


def _phases(floods, log_text: str) -> dict:
    """Per flood: its tally, plus how many connections reached a listener, were logged, were accepted.
    The engine logs the first rejected connections of a rendezvous one by one, with the client's address,
    and the rest as a count ("closed N more unauthenticated connection(s)"): logged_by_ranks counts the
    addresses, counted_by_ranks adds the counts (across all phases: the log does not say which)."""
    logged = set(re.findall(r"\d+\.\d+\.\d+\.\d+:\d+", log_text))
    counted = sum(int(n) for n in re.findall(r"closed (\d+) more unauthenticated connection", log_text))
    phases = {}
    for name, flood in floods:
        records = flood.records
        for r in records:
            r["logged"] = r["local"] in logged
            r["accepted"] = accepted(r)
        t = tally(records)
        t["reached_a_listener"] = sum(1 for r in records if r["local"])
        t["logged_by_ranks"] = sum(1 for r in records if r["logged"])
        t["counted_by_ranks"] = counted
        t["accepted"] = sum(1 for r in records if r["accepted"])
        t["accepted_examples"] = [r for r in records if r["accepted"]][:3]
        t["error_examples"] = [r for r in records if r["outcome"] == "error"][:3]
        phases[name] = t
    return phases


# What a listener sends before it has checked anything: its own Hello, the challenge (csrc/engine/wire.h).
SERVER_CHALLENGE_BYTES = 80


def accepted(r: dict) -> bool:
    """Whether the server took connection `r` for a peer: it kept it open, or it sent more than its
    challenge (the Hello every listener sends first, before the client has proved anything) before closing.
    A server that answers with its challenge and then closes the connection did not accept it."""
    if r["outcome"] == "open":
        return True
    if r["outcome"] != "replied":
        return False
    m = re.match(r"(\d+) bytes", r.get("detail", ""))
    return m is None or int(m.group(1)) > SERVER_CHALLENGE_BYTES


def reference_digest(world: int, pg_timeout_s: float = 30.0) -> str:
    """The weights' digest of the same job without any garbage."""
    rec = garbage_trial(world=world, rendezvous_connections=0, training_connections=0, pg_timeout_s=pg_timeout_s)
    if not rec["ok"]:
        raise RuntimeError(f"the reference run without garbage failed: {rec}")
    return rec["digest"]


def _setup_failure(rec, c, log_path, problem):
    rec.update(ok=False, problem=problem, events=[(r, k) for r, k, _ in c.events][-30:])
    try:
        with open(log_path, errors="replace") as f:
            rec["log"] = f.read()[-4000:]
        os.unlink(log_path)
    except OSError:
        pass
    return rec
