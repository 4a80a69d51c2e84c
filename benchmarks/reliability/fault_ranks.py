"""What the ranks of a fault trial run (inside the Cluster's rank processes).

`loop_until_error`: join the group, then run one collective over and over, checking every result, until
the backend raises (the harness kills or stops a rank meanwhile). The error is reported with the time it
was raised, then the rank checks the rest of the contract: a later call raises at once (the process group
stays failed), and destroy_process_group() returns.

`mismatch_call`: join the group, run a few matching collectives, then one call where the victim rank does
something different from the others (see MISMATCHES); report whether it raised, and if it returned,
whether its result is right for the call this rank made.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lightning_mccl.testing import now
from .collectives import all_gather_single, run_op

# Collectives a rank runs after returning from a mismatched call, to see whether it learns of the mismatch.
FOLLOW_UPS = 3


def _error_fields(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e)[:2000],
            "dist_error": isinstance(e, dist.DistBackendError)}


def _after_error(chan) -> dict:
    """The process group after its first error: a later call must raise at once; destroy must return."""
    out = {}
    t0 = now()
    try:
        dist.all_reduce(torch.ones(4))
        out["later_call"] = "returned"
    except Exception as e:  # noqa: BLE001 - the point of the check
        out["later_call"] = "raised"
        out["later_call_type"] = type(e).__name__
        out["later_call_message"] = str(e)[:300]
    out["later_call_s"] = now() - t0
    t0 = now()
    try:
        dist.destroy_process_group()
        out["destroy"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["destroy"] = f"raised {type(e).__name__}: {str(e)[:200]}"
    out["destroy_s"] = now() - t0
    return out


def loop_until_error(chan, op: str, n: int, max_s: float) -> None:
    chan.init_process_group()
    chan.send("ready")
    k = 0
    started = now()
    while True:
        try:
            wrong = run_op(op, n, chan.rank, chan.world, k)
        except Exception as e:  # noqa: BLE001 - what the trial waits for
            fields = _error_fields(e)
            fields["t"] = now()
            fields["iterations"] = k
            chan.send("error", **fields)
            chan.send("after", **_after_error(chan))
            return
        if wrong:
            chan.send("wrong", what=wrong, iteration=k)
        if k == 0:
            chan.send("looping")
        k += 1
        if now() - started > max_s:
            chan.send("no_error", iterations=k)
            return


# ----------------------------------------------------------------------------------------------------------
# Mismatch trials: (what the others call, what the victim calls) per kind. Each call is (label, function of
# (rank, world, n) returning (thunk, checker)); the checker tells whether a returned result is right for the
# call this rank made (None) or what is wrong.


def _allreduce(n, dtype=torch.float32, op=dist.ReduceOp.SUM):
    def call(rank, world):
        t = torch.full((n,), rank + 1, dtype=dtype)

        def check():
            if op == dist.ReduceOp.MAX:
                exp = world
            elif op == dist.ReduceOp.AVG:
                exp = (world + 1) / 2
            else:
                exp = world * (world + 1) // 2
            good = torch.equal(t, torch.full((n,), exp, dtype=dtype))
            return None if good else f"allreduce result {t[:3].tolist()}... expected {exp}"
        return (lambda: dist.all_reduce(t, op=op)), check
    return call


def _broadcast(n, root=0):
    def call(rank, world):
        r = min(root, world - 1)
        t = torch.full((n,), float(rank + 1) if rank == r else -1.0)

        def check():
            good = torch.equal(t, torch.full((n,), float(r + 1)))
            return None if good else f"broadcast(root {r}) result {t[:3].tolist()}... expected {r + 1}"
        return (lambda: dist.broadcast(t, src=r)), check
    return call


def _allgather(m):
    def call(rank, world):
        out = torch.empty(m * world)
        inp = torch.full((m,), float(rank + 1))

        def check():
            exp = torch.cat([torch.full((m,), float(r + 1)) for r in range(world)])
            return None if torch.equal(out, exp) else f"allgather result {out[:3].tolist()}... wrong"
        return (lambda: all_gather_single(out, inp)), check
    return call


def _barrier():
    def call(rank, world):
        return (lambda: dist.barrier()), (lambda: None)
    return call


def _alltoall(m, extra_to_next=0):
    def call(rank, world):
        # the victim claims to send `m + extra` elements to its right neighbour; everyone else expects m
        splits = [m] * world
        splits[(rank + 1) % world] += extra_to_next
        inp = torch.full((sum(splits),), float(rank + 1))
        out = torch.empty(m * world)

        def check():
            exp = torch.cat([torch.full((m,), float(r + 1)) for r in range(world)])
            return None if torch.equal(out, exp) else f"alltoall result {out[:3].tolist()}... wrong"
        return (lambda: dist.all_to_all_single(out, inp, output_split_sizes=[m] * world,
                                               input_split_sizes=splits)), check
    return call


def mismatches(n: int):
    """{kind: (others' call, victim's call)}."""
    return {
        "collective": (_allreduce(n), _broadcast(n)),
        "allreduce_vs_allgather": (_allreduce(n), _allgather(n)),
        "barrier_vs_allreduce": (_barrier(), _allreduce(n)),
        "count": (_allreduce(n), _allreduce(n + 1)),
        "dtype": (_allreduce(n), _allreduce(n, torch.float64)),
        "dtype_same_bytes": (_allreduce(n), _allreduce(n, torch.int32)),
        "reduce_op": (_allreduce(n), _allreduce(n, op=dist.ReduceOp.MAX)),
        "avg_vs_sum": (_allreduce(n), _allreduce(n, op=dist.ReduceOp.AVG)),
        "broadcast_root": (_broadcast(n, 0), _broadcast(n, 1)),
        "broadcast_count": (_broadcast(n), _broadcast(n + 3)),
        "allgather_count": (_allgather(max(1, n // 8)), _allgather(max(1, n // 8) + 1)),
        "alltoall_splits": (_alltoall(max(1, n // 8)), _alltoall(max(1, n // 8), extra_to_next=1)),
    }


MISMATCH_KINDS = tuple(mismatches(4))


def mismatch_call(chan, kind: str, victim: int, n: int, warmup: int) -> None:
    chan.init_process_group()
    for k in range(warmup):
        wrong = run_op("allreduce", 1024, chan.rank, chan.world, k)
        if wrong:
            chan.send("wrong", what=f"warm-up: {wrong}")
    others, victims = mismatches(n)[kind]
    thunk, check = (victims if chan.rank == victim else others)(chan.rank, chan.world)
    chan.send("calling")
    t0 = now()
    try:
        thunk()
    except Exception as e:  # noqa: BLE001 - the outcome being measured
        fields = _error_fields(e)
        fields["latency_s"] = now() - t0
        chan.send("error", **fields)
        chan.send("after", **_after_error(chan))
        return
    latency = now() - t0
    wrong = check()
    # A rank that returned (a broadcast root finishes once its data is sent) must still learn of the mismatch
    # before it trusts anything else: its next collectives either raise or return right results.
    follow_up = None
    for k in range(FOLLOW_UPS):
        try:
            bad = run_op("allreduce", 1024, chan.rank, chan.world, 100 + k)
        except Exception as e:  # noqa: BLE001
            follow_up = {"outcome": "raised", "at": k, **_error_fields(e)}
            break
        if bad:
            follow_up = {"outcome": "wrong", "at": k, "what": bad}
            break
    chan.send("returned", latency_s=latency, wrong=wrong, follow_up=follow_up or {"outcome": "ok"})
    # Stay in the group until the harness says so: leaving would turn the other ranks' pending mismatch
    # into a "connection lost", hiding whether they detected the mismatch themselves.
    chan.wait_for("exit", timeout=chan.pg_timeout_s + 5)
