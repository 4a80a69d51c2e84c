"""The data-movement cases of `test_collectives`: broadcast, all_gather (list and tensor forms), all_to_all
(list and single, with split sizes), gather and scatter. Each sweep records one case per (dtype, count,
root) through `checks.Sweep`."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from checks import DTYPES, Sweep, all_inputs, check_tensor, counts, dname, gen, sentinel_like


def _all_gather_single():
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
