"""The point-to-point and asynchronous cases of `test_collectives`: barrier, send/recv (also from any
source), async work handles and futures, and a collective issued from a future's callback."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from checks import Sweep, all_inputs, check_tensor, dname, gen, sentinel_like, tolerance


CALLBACK_DEADLINE_S = 15.0


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
