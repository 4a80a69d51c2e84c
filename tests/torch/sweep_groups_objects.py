"""The cases of `test_collectives` beyond plain tensors on the world group: subgroups, the object
collectives and non-contiguous tensors."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from checks import GlooGap, Sweep, all_inputs, check_tensor, tolerance, work_or_clear_error


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
