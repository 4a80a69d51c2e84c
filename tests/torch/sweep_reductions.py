"""The reduction cases of `test_collectives`: all_reduce (every op and dtype, integer wraparound, large
buffers), reduce, reduce_scatter (list and tensor forms), PREMUL_SUM and the coalesced forms. Each sweep
records one case per (dtype, op, count, root) through `checks.Sweep`; the float64 references are in `checks`."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from checks import (BASIC_OPS, BIT_OPS, DTYPES, FLOATS, INTS, Sweep, all_inputs, check_tensor, counts, digest,
                    dname, make_avg_divisible, op_kind, reduce_ref, rop, sentinel_like, tolerance,
                    work_or_clear_error)


LARGE_N = 2**21 + 7  # ~2M float32 (8 MiB), odd so no chunking divides it evenly


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
