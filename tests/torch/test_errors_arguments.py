"""Local argument errors must give a clear Python exception, never a hang or a crash.

Unsupported dtype or op, wrong tensor count, sparse tensors, out-of-range ranks and wrong sizes are swept in
one 2-rank run: each must raise an Exception subclass whose message names the cause (checked with lenient
regexes, `error_checks`), and the process group must still work afterwards. Where the backend may
legitimately support the input instead (int16, sparse, PREMUL_SUM), the result must then be correct.

With MCCL_TEST_BACKEND=gloo the same cases run where Gloo supports them; Gloo crashes on out-of-range
peers, so those cases are skipped for gloo only."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from checks import GlooGap, Sweep, check_tensor, rop
from error_checks import expect_error, still_works, works_or_error
from lightning_mccl.testing import progress, run_ranks


ARG_GROUPS = ["unsupported_dtype", "complex", "unsupported_op", "tensor_count", "sparse", "bad_rank", "bad_sizes"]


def bad_arguments_worker(rank, ws):
    warnings.filterwarnings("ignore")
    backend = dist.get_backend()
    s = Sweep(rank, ws, backend)
    gloo = backend == "gloo"

    def case(group, label, fn):
        def run():
            fn()
            still_works(rank, ws, label)

        s.case(group, label, run)

    # --- dtypes the engine does not list: int16, uint16 (mccl: float32/64, float16, bfloat16, int8, uint8, int32, int64, bool)
    for dtype, names in [(torch.int16, r"int16|short"), (torch.uint16, r"uint16|ushort")]:
        dn = str(dtype).replace("torch.", "")

        def ar(dtype=dtype, names=names, dn=dn):
            t = (torch.arange(6) * (rank + 1)).to(dtype)
            exp = (np.arange(6) * sum(r + 1 for r in range(ws)))

            def call():
                dist.all_reduce(t)

            s.gloo_gap(f"{dn} support (and its message does not name the dtype)", lambda: works_or_error(
                call, lambda: check_tensor(t.to(torch.int64), exp, torch.int64, (6,)),
                f"all_reduce {dn}", names, r"dtype|type|support"))

        case("unsupported_dtype", f"all_reduce {dn}: correct or error naming the dtype", ar)

        def bc(dtype=dtype, names=names, dn=dn):
            t = (torch.arange(6) + 10 * rank).to(dtype)

            def call():
                dist.broadcast(t, src=1)

            s.gloo_gap(f"{dn} support (and its message does not name the dtype)", lambda: works_or_error(
                call, lambda: check_tensor(t.to(torch.int64), np.arange(6) + 10, torch.int64, (6,)),
                f"broadcast {dn}", names, r"dtype|type|support"))

        case("unsupported_dtype", f"broadcast {dn}: correct or error naming the dtype", bc)

    def ag_int16():
        t = (torch.arange(4) + 10 * rank).to(torch.int16)
        out = torch.zeros(4 * ws, dtype=torch.int16)

        def call():
            dist.all_gather_into_tensor(out, t)

        exp = np.concatenate([np.arange(4) + 10 * r for r in range(ws)])
        s.gloo_gap("int16 support", lambda: works_or_error(
            call, lambda: check_tensor(out.to(torch.int64), exp, torch.int64, (4 * ws,)),
            "all_gather_into_tensor int16", r"int16|short", r"dtype|type|support"))

    case("unsupported_dtype", "all_gather_into_tensor int16: correct or error naming the dtype", ag_int16)

    # --- complex: torch.distributed views complex tensors as real pairs for SUM/AVG, so they must just work
    for dtype in (torch.complex64, torch.complex128):
        for op in ("SUM", "AVG"):
            def cx(dtype=dtype, op=op):
                base = torch.arange(5, dtype=torch.float64)
                t = torch.complex(base * (rank + 1), -base + rank).to(dtype)
                dist.all_reduce(t, op=rop(op))
                re_ = sum((base * (r + 1)).numpy() for r in range(ws))
                im_ = sum((-base + r).numpy() for r in range(ws))
                if op == "AVG":
                    re_, im_ = re_ / ws, im_ / ws
                check_tensor(t.real.contiguous(), re_, t.real.dtype, (5,), what="real part")
                check_tensor(t.imag.contiguous(), im_, t.real.dtype, (5,), what="imaginary part")

            case("complex", f"all_reduce {dtype} {op}", cx)

    def cx_bc():
        t = torch.complex(torch.arange(4.0) + rank, torch.full((4,), float(rank)))
        dist.broadcast(t, src=1)
        check_tensor(torch.view_as_real(t).contiguous(), np.stack([np.arange(4.0) + 1, np.ones(4)], axis=1),
                     torch.float32, (4, 2), what="broadcast complex64")

    case("complex", "broadcast complex64", cx_bc)

    # --- ops that make no sense for the dtype
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for op in ("BAND", "BOR", "BXOR"):
            def bad_op(dtype=dtype, op=op):
                t = torch.ones(4, dtype=dtype)
                expect_error(lambda: dist.all_reduce(t, op=rop(op)), f"all_reduce {op} on {dtype}",
                             r"band|bor|bxor|bitwise", r"float|dtype|integ|type|bfloat|half|double")

            case("unsupported_op", f"all_reduce {op} on {str(dtype).replace('torch.', '')}", bad_op)

    def bad_reduce_op():
        expect_error(lambda: dist.reduce(torch.ones(4), dst=0, op=dist.ReduceOp.BXOR), "reduce BXOR on float32",
                     r"bxor|bitwise", r"float|dtype|integ|type")

    case("unsupported_op", "reduce BXOR on float32", bad_reduce_op)

    def bad_rs_op():
        expect_error(lambda: dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * ws), op=dist.ReduceOp.BAND),
                     "reduce_scatter_tensor BAND on float32", r"band|bitwise", r"float|dtype|integ|type")

    case("unsupported_op", "reduce_scatter_tensor BAND on float32", bad_rs_op)

    def bool_avg():
        t = torch.ones(4, dtype=torch.bool)
        s.gloo_gap("a clear message for AVG on bool", lambda: expect_error(
            lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG), "all_reduce AVG on bool", r"avg|average", r"bool"))

    case("unsupported_op", "all_reduce AVG on bool", bool_avg)

    def premul():
        t = torch.arange(4.0) + rank
        exp = sum(2.5 * (np.arange(4.0) + r) for r in range(ws))
        works_or_error(lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.5)),
                       lambda: check_tensor(t, exp, torch.float32, (4,), tol=np.full(4, 1e-5 * ws)),
                       "all_reduce PREMUL_SUM", r"premul|pre_mul|premultipl|unsupported|not supported")

    case("unsupported_op", "all_reduce PREMUL_SUM(2.5): correct or clear error", premul)

    # --- wrong number of tensors through the low-level backend API (one tensor per call is the contract)
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    count_words = r"tensor"

    def two_allreduce():
        ts = [torch.ones(3), torch.ones(3)]
        s.gloo_gap("a tensor-count check (it reduces several tensors per call)", lambda: expect_error(
            lambda: be.allreduce(ts), "backend.allreduce([t1, t2])", count_words, r"\b(1|one|single|2|two)\b|count|number|exactly|list"))

    case("tensor_count", "allreduce with 2 tensors", two_allreduce)

    def zero_allreduce():
        expect_error(lambda: be.allreduce([]), "backend.allreduce([])", count_words,
                     r"\b(0|1|one|single|empty)\b|non-empty|count|number|exactly|list")

    case("tensor_count", "allreduce with 0 tensors", zero_allreduce)

    def two_broadcast():
        ts = [torch.ones(3), torch.ones(3)]
        s.gloo_gap("a tensor-count check (it broadcasts several tensors per call)", lambda: expect_error(
            lambda: be.broadcast(ts, dist.BroadcastOptions()), "backend.broadcast([t1, t2])", count_words,
            r"\b(1|one|single|2|two)\b|count|number|exactly|list"))

    case("tensor_count", "broadcast with 2 tensors", two_broadcast)

    def two_allgather():
        outs = [[torch.zeros(2) for _ in range(ws)] for _ in range(2)]
        expect_error(lambda: be.allgather(outs, [torch.ones(2), torch.ones(2)]), "backend.allgather with 2 inputs",
                     r"tensor|list|input|output", r"\b(1|one|single|2|two)\b|count|number|exactly|length|size")

    case("tensor_count", "allgather with 2 input tensors", two_allgather)

    # --- sparse tensors
    def sparse_ar():
        x = torch.sparse_coo_tensor([[0, 2 + rank % 2]], [1.0, 2.0], (4,))
        exp = np.zeros(4)
        for r in range(ws):
            exp[0] += 1.0
            exp[2 + r % 2] += 2.0

        def verify():
            check_tensor(x.to_dense(), exp, torch.float32, (4,), what="sparse all_reduce (dense view)")

        works_or_error(lambda: dist.all_reduce(x), verify, "all_reduce of a sparse tensor", r"sparse|layout|dense|strided")

    case("sparse", "all_reduce sparse COO: correct or error naming sparse", sparse_ar)

    # --- ranks that do not exist
    def bcast_root():
        expect_error(lambda: dist.broadcast(torch.ones(2), src=ws + 3), f"broadcast src={ws + 3}", r"rank|root|src",
                     rf"\b{ws + 3}\b")

    case("bad_rank", f"broadcast src={ws + 3}", bcast_root)

    def reduce_root():
        expect_error(lambda: dist.reduce(torch.ones(2), dst=ws + 3), f"reduce dst={ws + 3}", r"rank|root|dst",
                     rf"\b{ws + 3}\b")

    case("bad_rank", f"reduce dst={ws + 3}", reduce_root)

    # --- sizes that do not fit
    def ag_list_len():
        outs = [torch.zeros(2) for _ in range(ws + 1)]
        expect_error(lambda: dist.all_gather(outs, torch.ones(2)), "all_gather with ws+1 outputs",
                     r"length|size|count|world|expected|number|list", rf"\b{ws}\b|world")

    case("bad_sizes", "all_gather output list of world_size+1 tensors", ag_list_len)

    def ag_member_size():
        outs = [torch.zeros(2) for _ in range(ws)]
        outs[-1] = torch.zeros(3)
        expect_error(lambda: dist.all_gather(outs, torch.ones(2)), "all_gather with one output of the wrong size",
                     r"size|shape|numel|element|match")

    case("bad_sizes", "all_gather one output tensor of the wrong size", ag_member_size)

    def agit_size():
        expect_error(lambda: dist.all_gather_into_tensor(torch.zeros(2 * ws + 1), torch.ones(2)),
                     "all_gather_into_tensor output of 2*ws+1", r"size|shape|numel|element|match")

    case("bad_sizes", "all_gather_into_tensor output size not world_size * input", agit_size)

    def rst_size():
        expect_error(lambda: dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * ws + 1)),
                     "reduce_scatter_tensor input of 2*ws+1", r"size|shape|numel|element|match")

    case("bad_sizes", "reduce_scatter_tensor input size not world_size * output", rst_size)

    def a2a_splits():
        expect_error(lambda: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [1] * ws, [3] * ws),
                     "all_to_all_single splits that do not add up", r"split|size")

    case("bad_sizes", "all_to_all_single split sizes not summing to the tensor size", a2a_splits)

    # --- last: Gloo crashes the process (SIGSEGV) on a peer rank that does not exist, so gloo skips it
    for name, call in [("send", lambda: dist.send(torch.ones(2), ws + 5)), ("recv", lambda: dist.recv(torch.ones(2), ws + 5))]:
        def p2p(call=call, name=name):
            if gloo:
                raise GlooGap(f"gloo crashes (SIGSEGV) on {name} with a rank that does not exist")
            expect_error(call, f"{name} with peer {ws + 5}", r"rank|peer|dst|src", rf"\b{ws + 5}\b")

        case("bad_rank", f"{name} to/from rank {ws + 5}", p2p)

    progress("done")
    return s.result()


_ARG_RUN: list = []


def _arg_run():
    if not _ARG_RUN:
        try:
            _ARG_RUN.append(run_ranks(bad_arguments_worker, 2, timeout=120, pg_timeout=30))
        except AssertionError as e:
            _ARG_RUN.append(e)
    return _ARG_RUN[0]


@pytest.mark.parametrize("group", ARG_GROUPS)
def test_bad_arguments(group):
    got = _arg_run()
    if isinstance(got, AssertionError):
        pytest.fail(f"the 2-rank bad-argument run did not complete:\n{got}", pytrace=False)
    failures = [f for r in got for f in r["failures"].get(group, [])]
    if failures:
        pytest.fail(f"{len(failures)} failing case(s):\n" + "\n".join(failures), pytrace=False)
    passed = [r["passed"].get(group, 0) for r in got]
    skips = sorted({x for r in got for x in r["skips"].get(group, [])})
    if not any(passed):
        if skips:
            pytest.skip("; ".join(skips[:4]))
        pytest.fail(f"group {group!r} ran no case (test bug)", pytrace=False)
    if skips:
        print("skipped (backend gap):\n" + "\n".join(skips))
