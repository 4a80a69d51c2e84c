"""Every collective of the backend, checked against a float64 reference, for world sizes 1, 2, 3, 4 and 6.

One multi-process run per world size sweeps all cases (collective x dtype x op x element count x root);
each rank builds every rank's input from a shared seed, computes the expected result itself in float64
(or exact integers) and records a failure per case instead of stopping, so one run reports every broken
case. The pytest tests are one per (world size, group of cases) and read the cached run's records.

Every rank must also hold the same bytes after each all_reduce. If the run hangs or crashes, the groups
it finished are still judged from the per-case reports each rank streamed to the parent.

Run against Gloo to validate the tests themselves: MCCL_TEST_BACKEND=gloo. Gloo lacks a few things
(integer AVG, all_to_all with unequal sizes, the stacked all_gather_into_tensor output; it returns wrong
values for a strided-slice all_reduce and leaves bytes of 2 in a bool SUM); those call sites declare the
gap and are skipped (or relaxed) only when the backend is gloo, never for mccl.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from checks import (BASIC_OPS, BIT_OPS, DTYPES, FLOATS, INTS, GlooGap, Sweep, all_inputs, check_tensor, counts,
                    digest, dname, gen, make_avg_divisible, summary_from_reports, op_kind, reduce_ref, rop, sentinel_like, tolerance,
                    work_or_clear_error)
from harness import RunFailed, backend_name, progress, report, run_ranks

WORLD_SIZES = [1, 2, 3, 4, 6]
# The same sweep with every frame written by the sender thread (MCCL_SEND_THREAD_BYTES, on by default only
# on hosts with 4 CPUs per rank, which CI is not), and over three connections per peer (MCCL_NSOCKS).
VARIANTS = {"4-sender-thread": (4, {"MCCL_SEND_THREAD_BYTES": "1"}),
            "3-nsocks-3": (3, {"MCCL_NSOCKS": "3", "MCCL_SEND_THREAD_BYTES": "1"})}

GROUPS = [
    "coalesced",
    "premul_sum",
    "all_reduce.sum",
    "all_reduce.avg",
    "all_reduce.product",
    "all_reduce.min_max",
    "all_reduce.bitwise",
    "all_reduce.int_wraparound",
    "all_reduce.large",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "send_recv",
    "recv_any_source",
    "async",
    "subgroups",
    "objects",
    "non_contiguous",
    "async.collective_in_callback",
]


LARGE_N = 2**21 + 7  # ~2M float32 (8 MiB), odd so no chunking divides it evenly

RUN_TIMEOUT_S = 150.0
PG_TIMEOUT_S = 45.0
CALLBACK_DEADLINE_S = 15.0



def _all_gather_single():
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single():
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def sweep_all_reduce(s: Sweep):
    rank, ws = s.rank, s.ws
    for dtype in DTYPES:
        ops = BASIC_OPS + (BIT_OPS if not dtype.is_floating_point else [])
        for op in ops:
            if dtype == torch.bool and op == "AVG":
                continue  # an average of booleans is not meaningful
            group = {"SUM": "all_reduce.sum", "AVG": "all_reduce.avg", "PRODUCT": "all_reduce.product",
                     "MIN": "all_reduce.min_max", "MAX": "all_reduce.min_max"}.get(op, "all_reduce.bitwise")
            for n in counts(ws):
                label = f"all_reduce {dname(dtype)} {op} n={n}"

                def run(dtype=dtype, op=op, n=n, label=label):
                    vals = all_inputs(label, ws, n, dtype, op_kind(op, dtype))
                    if op == "AVG" and not dtype.is_floating_point:
                        vals = make_avg_divisible(vals, ws)
                    stack = np.stack([v for _, v in vals])
                    ref = reduce_ref(stack, op, dtype)
                    t = vals[rank][0].clone()
                    if op == "AVG" and not dtype.is_floating_point:
                        worked = s.gloo_gap(
                            "integer AVG",
                            lambda: work_or_clear_error(lambda: dist.all_reduce(t, op=rop(op)),
                                                        r"avg|average", f"AVG on {dname(dtype)}"),
                        )
                        if not worked:
                            return  # a clear refusal is acceptable for integer AVG
                    else:
                        dist.all_reduce(t, op=rop(op))
                    # Gloo adds bools as bytes (1 + 1 = 2); a 0/1-only result is required of mccl
                    lax = s.backend == "gloo" and dtype == torch.bool and op == "SUM"
                    check_tensor(t, ref, dtype, (n,), tolerance(op, dtype, ws, stack, ref), strict_bool=not lax)
                    s.digests[label] = digest(t)

                s.case(group, label, run)


def sweep_wraparound(s: Sweep):
    rank, ws = s.rank, s.ws
    if ws == 1:
        s.na("all_reduce.int_wraparound", "one rank: nothing to add, nothing wraps")
        return
    specs = [
        (torch.uint8, [200, 201, 255, 128]),
        (torch.int8, [100, 127, -128, -100]),
        (torch.int32, [2**31 - 1, 2**30 + 5, -(2**31), -(2**30)]),
        (torch.int64, [2**63 - 1, 2**62 + 9, -(2**63), -(2**62)]),
    ]
    for dtype, base in specs:
        label = f"all_reduce {dname(dtype)} SUM wraparound"

        def run(dtype=dtype, base=base):
            bits = torch.iinfo(dtype).bits
            signed = torch.iinfo(dtype).min < 0
            per_rank = [[b - (r % 3) if b > 0 else b + (r % 3) for b in base] for r in range(ws)]
            exp = []
            for j in range(len(base)):
                v = sum(per_rank[r][j] for r in range(ws)) % (1 << bits)
                if signed and v >= 1 << (bits - 1):
                    v -= 1 << bits
                exp.append(v)
            t = torch.tensor(per_rank[rank], dtype=dtype)
            dist.all_reduce(t)
            got = t.tolist()
            if got != exp:
                raise AssertionError(f"two's complement wraparound expected {exp}, got {got}")

        s.case("all_reduce.int_wraparound", label, run)


def sweep_large(s: Sweep):
    rank, ws = s.rank, s.ws

    def pattern(r):
        i = np.arange(LARGE_N, dtype=np.int64)
        # multiples of 1/8 below 64 in magnitude: exact in float32, and so is any sum of up to 6 of them
        return (((i * 7 + r * 13 + (i >> 11)) % 1024) - 512).astype(np.float64) / 8.0

    def run_ar():
        t = torch.from_numpy(pattern(rank).astype(np.float32))
        dist.all_reduce(t)
        ref = np.sum([pattern(r) for r in range(ws)], axis=0)
        check_tensor(t, ref, torch.float32, (LARGE_N,), None, what=f"{LARGE_N}-element all_reduce")
        s.digests["all_reduce large"] = digest(t)

    s.case("all_reduce.large", f"all_reduce float32 SUM n={LARGE_N}", run_ar)

    def run_bc():
        root = ws - 1
        t = torch.from_numpy(pattern(rank).astype(np.float32))
        dist.broadcast(t, src=root)
        check_tensor(t, pattern(root), torch.float32, (LARGE_N,), None, what=f"{LARGE_N}-element broadcast")

    s.case("all_reduce.large", f"broadcast float32 n={LARGE_N} root={ws - 1}", run_bc)


def sweep_broadcast(s: Sweep):
    rank, ws = s.rank, s.ws
    for dtype in DTYPES:
        for root in range(ws):
            for n in ([0, 1, 2 * ws + 1, 257] if root == 0 else [1, 2 * ws + 1]):
                label = f"broadcast {dname(dtype)} n={n} root={root}"

                def run(dtype=dtype, root=root, n=n, label=label):
                    t_root, v_root = gen(label, root, n, dtype, "minmax")
                    t = t_root.clone() if rank == root else sentinel_like(dtype, n)
                    dist.broadcast(t, src=root)
                    check_tensor(t, v_root, dtype, (n,))

                s.case("broadcast", label, run)


def sweep_reduce(s: Sweep):
    rank, ws = s.rank, s.ws
    combos = [(d, "SUM") for d in DTYPES] + [
        (torch.float32, "MIN"), (torch.float32, "MAX"), (torch.float32, "PRODUCT"), (torch.float32, "AVG"),
        (torch.bfloat16, "AVG"), (torch.int32, "MIN"), (torch.int32, "MAX"), (torch.int32, "PRODUCT"),
        (torch.bool, "MIN"),
    ]
    for dtype, op in combos:
        for root in range(ws):
            for n in [1, 2 * ws + 1] + ([0, 257] if root == ws - 1 else []):
                label = f"reduce {dname(dtype)} {op} n={n} root={root}"

                def run(dtype=dtype, op=op, root=root, n=n, label=label):
                    vals = all_inputs(label, ws, n, dtype, op_kind(op, dtype))
                    stack = np.stack([v for _, v in vals])
                    ref = reduce_ref(stack, op, dtype)
                    t = vals[rank][0].clone()
                    dist.reduce(t, dst=root, op=rop(op))
                    if rank == root:
                        lax = s.backend == "gloo" and dtype == torch.bool and op == "SUM"  # see all_reduce
                        check_tensor(t, ref, dtype, (n,), tolerance(op, dtype, ws, stack, ref), strict_bool=not lax)

                s.case("reduce", label, run)


def sweep_all_gather(s: Sweep):
    rank, ws = s.rank, s.ws
    ag_single = _all_gather_single()
    for dtype in DTYPES:
        for n in counts(ws):
            label = f"all_gather {dname(dtype)} n={n}"

            def run_list(dtype=dtype, n=n, label=label):
                vals = all_inputs(label, ws, n, dtype, "minmax")
                outs = [sentinel_like(dtype, n) for _ in range(ws)]
                dist.all_gather(outs, vals[rank][0].clone())
                for r in range(ws):
                    check_tensor(outs[r], vals[r][1], dtype, (n,), what=f"output[{r}]")

            s.case("all_gather", label, run_list)

            label2 = f"all_gather_into_tensor {dname(dtype)} n={n}"

            def run_flat(dtype=dtype, n=n, label=label2):
                vals = all_inputs(label, ws, n, dtype, "minmax")
                out = sentinel_like(dtype, ws * n)
                ag_single(out, vals[rank][0].clone())
                check_tensor(out, np.concatenate([v for _, v in vals]), dtype, (ws * n,), what="concatenated output")

            s.case("all_gather_into_tensor", label2, run_flat)

        label3 = f"all_gather_into_tensor {dname(dtype)} 2-D concatenated (ws*3, 5)"

        def run_cat2d(dtype=dtype, label=label3):
            vals = all_inputs(label, ws, 15, dtype, "minmax")
            out = sentinel_like(dtype, ws * 15).reshape(ws * 3, 5)
            ag_single(out, vals[rank][0].clone().reshape(3, 5))
            check_tensor(out, np.concatenate([v for _, v in vals]), dtype, (ws * 3, 5), what="concatenated 2-D output")

        s.case("all_gather_into_tensor", label3, run_cat2d)

        label4 = f"all_gather_into_tensor {dname(dtype)} stacked (ws, 3, 5)"

        def run_stacked(dtype=dtype, label=label4):
            vals = all_inputs(label, ws, 15, dtype, "minmax")
            out = sentinel_like(dtype, ws * 15).reshape(ws, 3, 5)
            s.gloo_gap("the stacked output form of all_gather_into_tensor",
                       lambda: ag_single(out, vals[rank][0].clone().reshape(3, 5)))
            check_tensor(out, np.stack([v for _, v in vals]), dtype, (ws, 3, 5), what="stacked output")

        s.case("all_gather_into_tensor", label4, run_stacked)


def sweep_reduce_scatter(s: Sweep):
    rank, ws = s.rank, s.ws
    rs_single = _reduce_scatter_single()
    combos = [(d, op) for d in FLOATS for op in BASIC_OPS] + [
        (d, op) for d in INTS for op in ["SUM", "MIN", "MAX"]] + [(torch.bool, "MAX"), (torch.bool, "MIN")]
    for dtype, op in combos:
        for n in sorted({0, 1, ws + 1, 37}):
            for form in ("list", "tensor"):
                label = f"reduce_scatter{'_tensor' if form == 'tensor' else ''} {dname(dtype)} {op} n={n}"

                def run(dtype=dtype, op=op, n=n, form=form, label=label):
                    # rank src's input is ws blocks of n; block r goes (reduced) to rank r
                    vals = all_inputs(label, ws, ws * n, dtype, op_kind(op, dtype))
                    stack = np.stack([v for _, v in vals]).reshape(ws, ws, n)[:, rank, :]
                    ref = reduce_ref(stack, op, dtype)
                    out = sentinel_like(dtype, n)
                    mine = vals[rank][0].clone()
                    if form == "list":
                        dist.reduce_scatter(out, list(mine.split(n) if n else [mine[:0].clone() for _ in range(ws)]), op=rop(op))
                    else:
                        rs_single(out, mine, op=rop(op))
                    check_tensor(out, ref, dtype, (n,), tolerance(op, dtype, ws, stack, ref))

                s.case("reduce_scatter" if form == "list" else "reduce_scatter_tensor", label, run)


def a2a_split(i, j, ws, salt):
    """Elements rank i sends to rank j: uneven, zero for some pairs."""
    return (3 * i + 5 * j + salt) % 4


def sweep_all_to_all(s: Sweep):
    rank, ws = s.rank, s.ws
    for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool]:
        for salt in (0, 1, 2):
            label = f"all_to_all_single {dname(dtype)} uneven splits salt={salt}"

            def run_single(dtype=dtype, salt=salt, label=label):
                def piece(i, j):
                    return gen(label, i, a2a_split(i, j, ws, salt) * 3, dtype, "minmax", j)

                in_splits = [a2a_split(rank, j, ws, salt) for j in range(ws)]
                out_splits = [a2a_split(i, rank, ws, salt) for i in range(ws)]
                inp = torch.cat([piece(rank, j)[0] for j in range(ws)]).reshape(-1, 3)
                out = sentinel_like(dtype, sum(out_splits) * 3).reshape(-1, 3)
                dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
                ref = np.concatenate([piece(i, rank)[1] for i in range(ws)])
                check_tensor(out, ref, dtype, (sum(out_splits), 3), what=f"splits in={in_splits} out={out_splits}")

            s.case("all_to_all_single", label, run_single)

        label = f"all_to_all_single {dname(dtype)} even"

        def run_even(dtype=dtype, label=label):
            n = 5
            vals = all_inputs(label, ws, ws * n, dtype, "minmax")
            out = sentinel_like(dtype, ws * n)
            dist.all_to_all_single(out, vals[rank][0].clone())
            ref = np.concatenate([vals[i][1][rank * n:(rank + 1) * n] for i in range(ws)])
            check_tensor(out, ref, dtype, (ws * n,))

        s.case("all_to_all_single", label, run_even)

        for uneven in (False, True):
            label = f"all_to_all list {dname(dtype)} {'uneven sizes' if uneven else 'equal sizes'}"

            def run_list(dtype=dtype, uneven=uneven, label=label):
                def size(i, j):
                    return a2a_split(i, j, ws, 1) if uneven else 4

                def piece(i, j):
                    return gen(label, i, size(i, j), dtype, "minmax", j)

                inputs = [piece(rank, j)[0] for j in range(ws)]
                outputs = [sentinel_like(dtype, size(i, rank)) for i in range(ws)]
                call = lambda: dist.all_to_all(outputs, inputs)  # noqa: E731
                if uneven:
                    s.gloo_gap("all_to_all with unequal tensor sizes", call)
                else:
                    call()
                for i in range(ws):
                    check_tensor(outputs[i], piece(i, rank)[1], dtype, (size(i, rank),), what=f"output[{i}]")

            s.case("all_to_all", label, run_list)


def sweep_gather_scatter(s: Sweep):
    rank, ws = s.rank, s.ws
    for dtype in DTYPES:
        for root in range(ws):
            for n in ([0, 1, 2 * ws + 1] if root == 0 else [2 * ws + 1]):
                label = f"gather {dname(dtype)} n={n} root={root}"

                def run_gather(dtype=dtype, n=n, root=root, label=label):
                    vals = all_inputs(label, ws, n, dtype, "minmax")
                    outs = [sentinel_like(dtype, n) for _ in range(ws)] if rank == root else None
                    dist.gather(vals[rank][0].clone(), outs, dst=root)
                    if rank == root:
                        for r in range(ws):
                            check_tensor(outs[r], vals[r][1], dtype, (n,), what=f"gathered[{r}]")

                s.case("gather", label, run_gather)

                label = f"scatter {dname(dtype)} n={n} root={root}"

                def run_scatter(dtype=dtype, n=n, root=root, label=label):
                    vals = all_inputs(label, ws, n, dtype, "minmax")
                    out = sentinel_like(dtype, n)
                    dist.scatter(out, [t.clone() for t, _ in vals] if rank == root else None, src=root)
                    check_tensor(out, vals[rank][1], dtype, (n,))

                s.case("scatter", label, run_scatter)


def sweep_barrier(s: Sweep):
    rank, ws = s.rank, s.ws
    store = dist.distributed_c10d._get_default_store()

    for it in range(3):
        def run(it=it):
            late = it % ws
            if rank == late:
                time.sleep(0.5)
            store.set(f"barrier_test/{it}/{rank}", "here")
            t0 = time.monotonic()
            dist.barrier()
            waited = time.monotonic() - t0
            keys = [f"barrier_test/{it}/{r}" for r in range(ws)]
            if not store.check(keys):
                missing = [k for k in keys if not store.check([k])]
                raise AssertionError(f"barrier returned before every rank arrived: missing {missing}")
            if rank != late and ws > 1 and waited < 0.15:
                raise AssertionError(f"barrier returned after {waited:.3f}s although rank {late} arrived 0.5 s late")

        s.case("barrier", f"barrier #{it} (rank {it % ws} late)", run)


def sweep_p2p(s: Sweep):
    rank, ws = s.rank, s.ws
    if ws == 1:
        s.na("send_recv", "needs two ranks")
        s.na("recv_any_source", "needs two ranks")
        return
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool]:
        for n in [0, 1, 1000]:
            label = f"ring isend/irecv {dname(dtype)} n={n}"

            def run_ring(dtype=dtype, n=n, label=label):
                nxt, prv = (rank + 1) % ws, (rank - 1) % ws
                out = sentinel_like(dtype, n)
                reqs = [dist.isend(gen(label, rank, n, dtype, "minmax")[0], nxt), dist.irecv(out, prv)]
                for r in reqs:
                    r.wait()
                check_tensor(out, gen(label, prv, n, dtype, "minmax")[1], dtype, (n,), what=f"from rank {prv}")

            s.case("send_recv", label, run_ring)

        label = f"pairwise blocking send/recv {dname(dtype)}"

        def run_pairs(dtype=dtype, label=label):
            n = 33
            peer = rank ^ 1
            if peer >= ws:
                return  # odd world size: the last rank has no partner
            out = sentinel_like(dtype, n)
            mine = gen(label, rank, n, dtype, "minmax")[0]
            if rank < peer:
                dist.send(mine, peer)
                dist.recv(out, peer)
            else:
                dist.recv(out, peer)
                dist.send(mine, peer)
            check_tensor(out, gen(label, peer, n, dtype, "minmax")[1], dtype, (n,), what=f"from rank {peer}")

        s.case("send_recv", label, run_pairs)

    label = "batch_isend_irecv ring both directions float32"

    def run_batch(label=label):
        n = 100
        nxt, prv = (rank + 1) % ws, (rank - 1) % ws
        from_prv, from_nxt = torch.zeros(n), torch.zeros(n)
        ops = [
            dist.P2POp(dist.isend, gen(label, rank, n, torch.float32, "sum", "fwd")[0], nxt),
            dist.P2POp(dist.isend, gen(label, rank, n, torch.float32, "sum", "bwd")[0], prv),
            dist.P2POp(dist.irecv, from_prv, prv),
            dist.P2POp(dist.irecv, from_nxt, nxt),
        ]
        if ws == 2:  # prv == nxt: the two messages between the same pair must still arrive in order
            ops = [ops[0], ops[2], ops[1], ops[3]] if rank == 0 else [ops[2], ops[0], ops[3], ops[1]]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        if ws == 2:
            # same peer both ways; messages are matched in issue order: first recv gets first send
            check_tensor(from_prv, gen(label, prv, n, torch.float32, "sum", "fwd")[1], torch.float32, (n,), what="1st message")
            check_tensor(from_nxt, gen(label, nxt, n, torch.float32, "sum", "bwd")[1], torch.float32, (n,), what="2nd message")
        else:
            check_tensor(from_prv, gen(label, prv, n, torch.float32, "sum", "fwd")[1], torch.float32, (n,), what=f"from rank {prv}")
            check_tensor(from_nxt, gen(label, nxt, n, torch.float32, "sum", "bwd")[1], torch.float32, (n,), what=f"from rank {nxt}")

    s.case("send_recv", label, run_batch)

    def run_any():
        # every rank except 0 sends a tensor holding its own rank; rank 0 receives them without naming the source
        if rank == 0:
            seen = []
            for _ in range(ws - 1):
                t = torch.full((4,), -1.0)
                sender = dist.recv(t)
                if not isinstance(sender, int):
                    raise AssertionError(f"dist.recv without src returned {sender!r}, expected the sender's rank (int)")
                if not torch.equal(t, torch.full((4,), float(sender))):
                    raise AssertionError(f"recv from any source says sender {sender} but received {t.tolist()}")
                seen.append(sender)
            if sorted(seen) != list(range(1, ws)):
                raise AssertionError(f"senders reported {seen}, expected each of 1..{ws - 1} once")
        else:
            dist.send(torch.full((4,), float(rank)), 0)

    s.case("recv_any_source", "recv(src=None) at rank 0 from every other rank", run_any)


def sweep_async(s: Sweep):
    rank, ws = s.rank, s.ws

    def inputs(label, k, n=64):
        vals = all_inputs(label, ws, n, torch.float32, "sum", k)
        stack = np.stack([v for _, v in vals])
        ref = stack.sum(axis=0)
        return vals[rank][0].clone(), ref, tolerance("SUM", torch.float32, ws, stack, ref)

    def run_many():
        label = "async many in flight"
        items = [inputs(label, k, 64 + 17 * k) for k in range(6)]
        works = [dist.all_reduce(t, async_op=True) for t, _, _ in items]
        bc = torch.arange(10.0) * (rank + 1)
        wb = dist.broadcast(bc, src=ws - 1, async_op=True)
        for w in reversed(works):
            w.wait()
        wb.wait()
        for k, (t, ref, tol) in enumerate(items):
            check_tensor(t, ref, torch.float32, (64 + 17 * k,), tol, what=f"async all_reduce #{k}")
        check_tensor(bc, np.arange(10.0) * ws, torch.float32, (10,), what="async broadcast")

    s.case("async", "6 async all_reduce + broadcast in flight, waited in reverse", run_many)

    def run_future():
        t, ref, tol = inputs("async future", 0)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        chained = fut.then(lambda f: [x * 2 for x in f.value()] if isinstance(f.value(), list) else f.value() * 2)
        work.wait()
        value = chained.wait()
        doubled = value[0] if isinstance(value, list) else value
        check_tensor(doubled, 2 * ref, torch.float32, (64,), 2 * tol, what="future.then(callback) value")
        check_tensor(t, ref, torch.float32, (64,), tol, what="tensor after wait")
        if not fut.done():
            raise AssertionError("work.get_future().done() is False after wait()")

    s.case("async", "get_future().then(callback)", run_future)

    def run_completed():
        t, ref, tol = inputs("async is_completed", 0, 4096)
        work = dist.all_reduce(t, async_op=True)
        deadline = time.monotonic() + 30.0
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise AssertionError("is_completed() still False 30 s after the async all_reduce was issued")
            time.sleep(0.002)
        # completed without wait(): the result must already be there
        check_tensor(t, ref, torch.float32, (4096,), tol, what="result when is_completed() turned True")
        work.wait()

    s.case("async", "is_completed() becomes True without wait()", run_completed)

    def run_fut_value():
        t, ref, tol = inputs("async future value", 1, 100)
        fut = dist.all_reduce(t, async_op=True).get_future()
        value = fut.wait()
        got = value[0] if isinstance(value, list) else value
        check_tensor(got, ref, torch.float32, (100,), tol, what="future value")

    s.case("async", "get_future().wait() value", run_fut_value)


def sweep_subgroups(s: Sweep):
    rank, ws = s.rank, s.ws
    evens = list(range(0, ws, 2))
    odds = list(range(1, ws, 2))
    groups = {}

    def create():
        # every rank must take part in creating every group
        groups["even"] = dist.new_group(evens)
        groups["odd"] = dist.new_group(odds) if odds else None
        groups["rev"] = dist.new_group(list(reversed(range(ws))))

    s.case("subgroups", "new_group(evens), new_group(odds), new_group(reversed ranks)", create)
    if len(groups) != 3:
        return
    g_even, g_odd, g_rev = groups["even"], groups["odd"], groups["rev"]
    mine = evens if rank % 2 == 0 else odds
    g_mine = g_even if rank % 2 == 0 else g_odd

    def run_allreduce():
        label = "subgroup all_reduce"
        vals = all_inputs(label, ws, 50, torch.float64, "sum")
        t = vals[rank][0].clone()
        dist.all_reduce(t, group=g_mine)  # even and odd groups run at the same time
        stack = np.stack([vals[r][1] for r in mine])
        ref = stack.sum(axis=0)
        check_tensor(t, ref, torch.float64, (50,), tolerance("SUM", torch.float64, len(mine), stack, ref),
                     what=f"all_reduce in group {mine}")
        if dist.get_world_size(g_mine) != len(mine) or dist.get_rank(g_mine) != mine.index(rank):
            raise AssertionError(f"group size/rank {dist.get_world_size(g_mine)}/{dist.get_rank(g_mine)} for {mine}")

    s.case("subgroups", "all_reduce in even ranks and in odd ranks concurrently", run_allreduce)

    def run_outsider():
        # ranks outside the even group call into it: nothing happens to their tensor
        t = torch.full((8,), float(rank + 1))
        dist.all_reduce(t, group=g_even)
        exp = float(sum(r + 1 for r in evens)) if rank in evens else float(rank + 1)
        check_tensor(t, np.full(8, exp), torch.float32, (8,), what="even-group all_reduce (outsiders untouched)")

    s.case("subgroups", "even-group all_reduce, odd ranks not participating", run_outsider)

    def run_bcast():
        src = mine[-1]  # a global rank
        t = torch.arange(7.0) + 100 * src if rank == src else torch.zeros(7)
        dist.broadcast(t, src=src, group=g_mine)
        check_tensor(t, np.arange(7.0) + 100 * src, torch.float32, (7,), what=f"broadcast from global rank {src} in {mine}")

    s.case("subgroups", "broadcast from a non-zero global rank inside the group", run_bcast)

    def run_rev():
        t = torch.tensor([float(rank)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g_rev)
        w = torch.tensor([float(rank)])
        dist.all_reduce(w)  # interleave with the world group
        check_tensor(t, [ws - 1.0], torch.float64, (1,), what="MAX in group built from reversed rank list")
        check_tensor(w, [ws * (ws - 1) / 2], torch.float32, (1,), what="world all_reduce after subgroup use")

    s.case("subgroups", "group from reversed rank list + world interleaved", run_rev)


def sweep_objects(s: Sweep):
    rank, ws = s.rank, s.ws

    def obj(r):
        return {"rank": r, "name": f"rank-{r}" * (r + 1), "nested": [r, (r, "x"), {"f": r / 3}], "blob": b"\x00\xff" * (r * 50)}

    for root in range(ws):
        def run_bcast(root=root):
            objs = [obj(root), "second", None] if rank == root else [None, None, None]
            dist.broadcast_object_list(objs, src=root)
            if objs != [obj(root), "second", None]:
                raise AssertionError(f"broadcast_object_list from {root} gave {objs!r:.300}")

        s.case("objects", f"broadcast_object_list root={root}", run_bcast)

    def run_gather_obj():
        out = [None] * ws
        dist.all_gather_object(out, obj(rank))
        if out != [obj(r) for r in range(ws)]:
            raise AssertionError(f"all_gather_object gave {out!r:.300}")

    s.case("objects", "all_gather_object", run_gather_obj)


def sweep_non_contiguous(s: Sweep):
    rank, ws = s.rank, s.ws

    def base(r):
        return torch.arange(24, dtype=torch.float32).reshape(4, 6) * (r + 1) + r

    def run_ar_t():
        t = base(rank).t()  # (6, 4) transposed view, not contiguous
        assert not t.is_contiguous()
        if work_or_clear_error(lambda: dist.all_reduce(t), r"contiguous", "all_reduce of a transposed view"):
            ref = sum(base(r).t().to(torch.float64) for r in range(ws)).numpy()
            check_tensor(t, ref, torch.float32, (6, 4), what="all_reduce on a transposed view")

    s.case("non_contiguous", "all_reduce transposed view", run_ar_t)

    def run_ar_slice():
        full = base(rank)
        view = full[:, ::2]  # every other column
        untouched = full[:, 1::2].clone()
        if work_or_clear_error(lambda: dist.all_reduce(view), r"contiguous", "all_reduce of a strided slice"):
            ref = sum(base(r)[:, ::2].to(torch.float64) for r in range(ws)).numpy()
            try:
                check_tensor(view, ref, torch.float32, (4, 3), what="all_reduce on a strided slice")
                check_tensor(full[:, 1::2], untouched.numpy(), torch.float32, (4, 3), what="elements between the slice")
            except AssertionError as e:
                if s.backend == "gloo":  # Gloo silently reduces the wrong memory for strided slices
                    raise GlooGap(f"gloo mishandles strided slices: {e}") from e
                raise

    s.case("non_contiguous", "all_reduce strided slice (base elements in between untouched)", run_ar_slice)

    def run_bc_t():
        root = ws - 1
        t = base(rank).t()
        if work_or_clear_error(lambda: dist.broadcast(t, src=root), r"contiguous", "broadcast of a transposed view"):
            check_tensor(t, base(root).t().numpy(), torch.float32, (6, 4), what="broadcast on a transposed view")

    s.case("non_contiguous", "broadcast transposed view", run_bc_t)


def sweep_callback_collective(s: Sweep):
    """A collective issued and waited on inside a future callback (what DDP's powerSGD_hook does)."""
    rank, ws = s.rank, s.ws

    def run():
        # the first all_reduce is large so that then() is attached before it completes: the callback
        # then runs wherever the backend completes futures, not inline in this thread
        first = torch.full((1 << 20,), float(rank + 1))
        second = torch.full((7,), float(10 * (rank + 1)))

        def callback(fut):
            # runs when the first all_reduce completes, possibly on the backend's own thread
            inner = dist.all_reduce(second, async_op=True).get_future()
            return inner.wait()[0] * 2

        chained = dist.all_reduce(first, async_op=True).get_future().then(callback)
        deadline = time.monotonic() + CALLBACK_DEADLINE_S
        while not chained.done():
            if time.monotonic() > deadline:
                s.stuck = True
                raise AssertionError(
                    f"deadlock: the chained future is not done after {CALLBACK_DEADLINE_S:.0f}s; a collective "
                    "issued and waited on inside a Future.then() callback never completes (the callback "
                    "probably runs on the backend's only worker thread and blocks it). DDP's powerSGD_hook "
                    "does exactly this.")
            time.sleep(0.005)
        value = chained.wait()
        total = ws * (ws + 1) / 2
        check_tensor(first, np.full(1 << 20, total), torch.float32, (1 << 20,), what="first all_reduce")
        check_tensor(second, np.full(7, 10 * total), torch.float32, (7,), what="all_reduce issued in the callback")
        check_tensor(value, np.full(7, 20 * total), torch.float32, (7,), what="callback's value")

    s.case("async.collective_in_callback", "all_reduce(...).get_future().wait() inside a then() callback", run)


def sweep_coalesced(s: Sweep):
    """The coalesced entry points (one packed allreduce for several tensors; allgather per tensor)."""
    rank, ws = s.rank, s.ws
    for dtype, op in [(torch.float32, "SUM"), (torch.float64, "MAX"), (torch.int64, "SUM")]:
        label = f"all_reduce_coalesced {dname(dtype)} {op}"

        def run(dtype=dtype, op=op, label=label):
            shapes = [(3, 4), (0,), (7,), (2, 1, 5)]
            ins = [all_inputs(f"{label} {i}", ws, int(np.prod(sh)), dtype, op_kind(op, dtype)) for i, sh in enumerate(shapes)]
            ts = [vals[rank][0].clone().reshape(sh) for vals, sh in zip(ins, shapes)]
            s.gloo_gap("all_reduce_coalesced", lambda: dist.all_reduce_coalesced(ts, op=rop(op)))
            for t, vals, sh in zip(ts, ins, shapes):
                stack = np.stack([v for _, v in vals])
                ref = reduce_ref(stack, op, dtype).reshape(sh)
                check_tensor(t.reshape(-1), ref.reshape(-1), dtype, (int(np.prod(sh)),),
                             tolerance(op, dtype, ws, stack, ref.reshape(-1)))

        s.case("coalesced", label, run)

    label = "all_gather_coalesced float32"

    def run_gather(label=label):
        ins = [all_inputs(f"{label} {i}", ws, n, torch.float32, "sum") for i, n in enumerate([5, 1, 9])]
        outs = [[torch.empty(len(vals[0][1])) for vals in ins] for _ in range(ws)]  # outs[r][i]: rank r's input i
        s.gloo_gap("all_gather_coalesced",
                   lambda: dist.all_gather_coalesced(outs, [vals[rank][0] for vals in ins]))
        for i, vals in enumerate(ins):
            for r in range(ws):
                check_tensor(outs[r][i], vals[r][1], torch.float32, (len(vals[r][1]),), what=f"input {i} of rank {r}")

    s.case("coalesced", label, run_gather)


def sweep_premul_sum(s: Sweep):
    """PREMUL_SUM (each rank's input scaled by a factor, then summed), as FSDP and DDP hooks may use it."""
    rank, ws = s.rank, s.ws
    for factor in (0.25, torch.tensor(0.5, dtype=torch.float64)):
        label = f"all_reduce PREMUL_SUM factor={float(factor)}"

        def run(factor=factor, label=label):
            vals = all_inputs(label, ws, 33, torch.float64, "sum")
            stack = np.stack([v for _, v in vals])
            ref = stack.sum(axis=0) * float(factor)
            t = vals[rank][0].clone()
            op = dist._make_nccl_premul_sum(factor)
            s.gloo_gap("PREMUL_SUM", lambda: dist.all_reduce(t, op=op))
            check_tensor(t, ref, torch.float64, (33,), 1e-12)

        s.case("premul_sum", label, run)


# (sweep, the groups it covers), in run order; hang-prone cases last
SWEEPS = [
    (sweep_coalesced, ["coalesced"]),
    (sweep_premul_sum, ["premul_sum"]),
    (sweep_all_reduce, ["all_reduce.sum", "all_reduce.avg", "all_reduce.product", "all_reduce.min_max",
                        "all_reduce.bitwise"]),
    (sweep_wraparound, ["all_reduce.int_wraparound"]),
    (sweep_broadcast, ["broadcast"]),
    (sweep_reduce, ["reduce"]),
    (sweep_all_gather, ["all_gather", "all_gather_into_tensor"]),
    (sweep_reduce_scatter, ["reduce_scatter", "reduce_scatter_tensor"]),
    (sweep_all_to_all, ["all_to_all", "all_to_all_single"]),
    (sweep_gather_scatter, ["gather", "scatter"]),
    (sweep_barrier, ["barrier"]),
    (sweep_p2p, ["send_recv", "recv_any_source"]),
    (sweep_subgroups, ["subgroups"]),
    (sweep_objects, ["objects"]),
    (sweep_non_contiguous, ["non_contiguous"]),
    (sweep_large, ["all_reduce.large"]),
    (sweep_async, ["async"]),
    (sweep_callback_collective, ["async.collective_in_callback"]),
]
assert sorted(g for _, gs in SWEEPS for g in gs) == sorted(GROUPS)


def collectives_worker(rank, ws):
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    s = Sweep(rank, ws, dist.get_backend())
    if dist.get_backend() != backend_name():
        raise AssertionError(f"process group backend is {dist.get_backend()!r}, expected {backend_name()!r}")
    for sweep, groups in SWEEPS:
        sweep(s)
        for g in groups:
            report(("done", g, None, None))
        if s.stuck:
            # every case so far is reported; the backend cannot be used any more (not even for destroy)
            raise AssertionError(f"stopping after {sweep.__name__}: the backend is stuck (see its failures)")
    progress("final barrier")
    dist.barrier()
    return s.result()


# ----------------------------------------------------------------------------------------------------------
# pytest side

_RUNS: dict[object, object] = {}


def _run(key):
    ws, env = VARIANTS.get(key, (key, None))
    if key not in _RUNS:
        t0 = time.monotonic()
        try:
            _RUNS[key] = (run_ranks(collectives_worker, ws, timeout=RUN_TIMEOUT_S, pg_timeout=PG_TIMEOUT_S, env=env),
                          time.monotonic() - t0)
        except AssertionError as e:
            _RUNS[key] = e
    return _RUNS[key]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("world_size", WORLD_SIZES + list(VARIANTS))
def test_collective(world_size, group):
    got = _run(world_size)
    world_size = VARIANTS.get(world_size, (world_size,))[0]
    run_problem = None
    if isinstance(got, RunFailed):
        # the run hung or crashed: judge the groups it finished from the reports sent before that
        results = [summary_from_reports(got.reports.get(r, [])) for r in range(world_size)]
        done = all(("done", group, None, None) in got.reports.get(r, []) for r in range(world_size))
        if not done:
            run_problem = str(got)
    elif isinstance(got, AssertionError):
        pytest.fail(f"the world_size={world_size} run did not complete:\n{got}", pytrace=False)
    else:
        results, _elapsed = got
    failures = [f for r in results for f in r["failures"].get(group, [])]
    if run_problem is not None:
        where = {r: got.last_progress.get(r) for r in range(world_size)}
        reached = any(r["passed"].get(group) or r["failures"].get(group) or r["skips"].get(group) for r in results)
        state = "was running this group when" if reached else "never reached this group:"
        pytest.fail(f"the world_size={world_size} run {state} it failed (last progress by rank: {where}).\n"
                    + ("Failures recorded before that:\n" + "\n".join(failures) + "\n" if failures else "")
                    + run_problem, pytrace=False)
    # all_reduce and friends: every rank must hold the very same bytes
    if group.startswith("all_reduce"):
        for label in sorted(results[0]["digests"]):
            ds = [r["digests"].get(label) for r in results]
            if all(d is not None for d in ds) and len(set(ds)) > 1 and _group_of(label) == group:
                failures.append(f"{label}: ranks hold different bytes after all_reduce: {ds}")
    if failures:
        pytest.fail(f"{len(failures)} failing case(s) at world_size={world_size}:\n" + "\n".join(failures), pytrace=False)
    passed = [r["passed"].get(group, 0) for r in results]
    skips = sorted({x for r in results for x in r["skips"].get(group, [])})
    na = results[0]["na"].get(group)
    if na and not any(passed):
        pytest.skip(f"not applicable at world_size={world_size}: {na}")
    if not any(passed):
        if skips:
            pytest.skip(f"{len(skips)} case(s) skipped: " + "; ".join(skips[:5]))
        pytest.fail(f"group {group!r} ran no case at world_size={world_size} (test bug)", pytrace=False)
    if skips:
        # partial: report what gloo could not do without hiding the passing cases
        print(f"{len(skips)} case(s) skipped (backend gap):\n" + "\n".join(skips))


def _group_of(label):
    if "wraparound" in label:
        return "all_reduce.int_wraparound"
    if "n=" + str(LARGE_N) in label or label == "all_reduce large":
        return "all_reduce.large"
    op = label.split()[2]
    return {"SUM": "all_reduce.sum", "AVG": "all_reduce.avg", "PRODUCT": "all_reduce.product",
            "MIN": "all_reduce.min_max", "MAX": "all_reduce.min_max"}.get(op, "all_reduce.bitwise")
