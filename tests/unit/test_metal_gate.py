"""The Metal reduction's gate (lightning_mccl.metal): settings, the self-test against the CPU reducer,
agreement of all ranks through a Store, log-once fallback. A stand-in device reducer on the CPU plays
Metal here; the real one runs in tests/macos (on a Mac only)."""
import logging
import threading

import pytest
import torch
import torch.distributed as dist

from lightning_mccl.metal import gate, kernels
from lightning_mccl.metal.gate import Decision, ReductionPath, self_test
from lightning_mccl.metal.settings import METAL_MIN_BYTES_DEFAULT, MetalSettings, SettingsError


class StandIn:
    """A device reducer that computes exactly like the CPU reducer (passes the self-test)."""

    name = "stand-in"
    device = "cpu"

    def __init__(self, why_unavailable=None):
        self.why_unavailable = why_unavailable
        self.calls = 0

    def unavailable_reason(self):
        return self.why_unavailable

    def reduce_(self, dst, src, op):
        self.calls += 1
        gate.cpu_reduce_(dst, src, op)


class FlushesSubnormals(StandIn):
    """Like many GPUs in fast mode: float32 subnormal results become zero."""

    def reduce_(self, dst, src, op):
        super().reduce_(dst, src, op)
        if dst.dtype == torch.float32:
            dst[(dst.abs() < torch.finfo(torch.float32).tiny) & (dst != 0)] = 0.0


class IgnoresNaN(StandIn):
    """MIN/MAX with fmin/fmax semantics (a NaN operand is dropped), unlike torch and the CPU reducer."""

    def reduce_(self, dst, src, op):
        if op in ("min", "max"):
            self.calls += 1
            dst.copy_((torch.fmin if op == "min" else torch.fmax)(dst.float(), src.float()).to(dst.dtype))
        else:
            super().reduce_(dst, src, op)


class Breaks(StandIn):
    """Passes the self-test, then raises on every later call (a device lost mid-run)."""

    def __init__(self):
        super().__init__()
        self.armed = False

    def reduce_(self, dst, src, op):
        if self.armed:
            raise RuntimeError("MTLCommandBuffer failed")
        super().reduce_(dst, src, op)


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    monkeypatch.setattr(gate, "_logged", set())


def on(mode="auto", min_bytes=0):
    return MetalSettings(mode, min_bytes)


def decide_all(reducers, settings, world=None):
    """Runs decide() on one thread per rank over one HashStore; returns each rank's Decision."""
    world = world or len(reducers)
    store = dist.HashStore()
    store.set_timeout(__import__("datetime").timedelta(seconds=20))
    paths = [ReductionPath(store, r, world, settings[r] if isinstance(settings, list) else settings,
                           (lambda red=red: red) if red is not None else None) for r, red in enumerate(reducers)]
    out = [None] * world
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, paths[r].decide())) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(not t.is_alive() for t in threads), "a rank is still waiting for the vote"
    return out, paths


# ---- settings

def test_settings_defaults_and_parsing():
    assert MetalSettings.from_env({}) == MetalSettings("0", METAL_MIN_BYTES_DEFAULT)
    assert METAL_MIN_BYTES_DEFAULT == 256 << 20
    assert MetalSettings.from_env({"MCCL_METAL": "AUTO", "MCCL_METAL_MIN_BYTES": "4096"}) == MetalSettings("auto", 4096)
    assert MetalSettings.from_env({"MCCL_METAL": "1"}).mode == "1"
    with pytest.raises(SettingsError, match=r"MCCL_METAL='yes': expected one of 0, auto, 1"):
        MetalSettings.from_env({"MCCL_METAL": "yes"})
    with pytest.raises(SettingsError, match=r"MCCL_METAL_MIN_BYTES='1M': expected a whole number of bytes"):
        MetalSettings.from_env({"MCCL_METAL_MIN_BYTES": "1M"})
    with pytest.raises(SettingsError, match="must not be negative"):
        MetalSettings.from_env({"MCCL_METAL_MIN_BYTES": "-1"})


# ---- the self-test

def test_self_test_passes_for_an_exact_reducer():
    assert self_test(StandIn()) is None


def test_self_test_catches_flushed_subnormals():
    failure = self_test(FlushesSubnormals())
    assert failure is not None and failure.startswith("float32 ")
    assert "where the CPU reducer gives" in failure


def test_self_test_catches_nan_dropping_min_max():
    failure = self_test(IgnoresNaN())
    assert failure is not None and (" min " in failure or " max " in failure), failure


def test_cpu_reference_rounds_half_types_through_float32():
    a = torch.tensor([65504.0, 1.0, float("nan")], dtype=torch.float16)
    b = torch.tensor([16.0, 2.0 ** -11, 1.0], dtype=torch.float16)
    gate.cpu_reduce_(a, b, "sum")
    assert a[0].item() == float("inf")  # 65520 is the tie: rounds to even, which is Inf
    assert a[1].item() == 1.0  # 1 + 2^-11 is the tie between 1 and 1 + 2^-10: even is 1
    assert torch.isnan(a[2])
    m = torch.tensor([1.0, float("nan")])
    gate.cpu_reduce_(m, torch.tensor([float("nan"), 0.0]), "max")
    assert torch.isnan(m).all()


# ---- selection and agreement

def test_off_by_default_never_builds_the_device_reducer():
    built = []
    store = dist.HashStore()
    path = ReductionPath(store, 0, 1, MetalSettings.from_env({}), lambda: built.append(1) or StandIn())
    assert path.decide() == Decision(None, "MCCL_METAL=0 (the default)")
    assert built == []
    dst = torch.ones(8)
    assert path.reduce_(dst, torch.ones(8), "sum") == "cpu" and dst.tolist() == [2.0] * 8


def test_all_ranks_pass_then_the_device_is_used_above_min_bytes():
    reducers = [StandIn(), StandIn(), StandIn()]
    decisions, paths = decide_all(reducers, on(min_bytes=1024))
    assert all(d.device == "stand-in" for d in decisions)
    assert decisions[0].reason == "stand-in passed the self-test on all 3 ranks"
    before = reducers[0].calls
    small, big = torch.ones(255), torch.ones(256)  # 1020 and 1024 bytes of float32
    assert paths[0].reduce_(small, torch.ones(255), "sum") == "cpu"
    assert paths[0].reduce_(big, torch.full((256,), 2.0), "product") == "stand-in"
    assert reducers[0].calls == before + 1 and big.tolist() == [2.0] * 256 and small.tolist() == [2.0] * 255


def test_one_failing_rank_keeps_every_rank_on_the_cpu(caplog):
    caplog.set_level(logging.INFO, logger="lightning_mccl.metal")
    decisions, _ = decide_all([StandIn(), FlushesSubnormals(), StandIn()], on())
    assert [d.device for d in decisions] == [None, None, None]
    assert decisions[1].reason.startswith("stand-in self-test failed: float32 ")
    assert decisions[0].reason == "rank 1 declined: " + decisions[1].reason
    assert decisions[2].reason == decisions[0].reason
    assert sum("CPU reducer (rank 1 declined" in r.message for r in caplog.records) == 2  # ranks 0 and 2


def test_unavailable_and_mixed_settings_decline_without_hanging():
    decisions, _ = decide_all([StandIn("not macOS (Linux)"), StandIn()], on())
    assert decisions[0] == Decision(None, "stand-in unavailable: not macOS (Linux)")
    assert decisions[1].reason == "rank 0 declined: stand-in unavailable: not macOS (Linux)"
    decisions, _ = decide_all([StandIn(), StandIn()], [MetalSettings("0", 0), on()])
    assert decisions[1] == Decision(None, "rank 0 declined: MCCL_METAL=0 (the default)")
    decisions, _ = decide_all([None, StandIn()], on())
    assert decisions[0].reason == "no device reducer in this build" and decisions[1].device is None


def test_a_reducer_that_raises_in_the_self_test_declines():
    class NoCompiler(StandIn):
        def reduce_(self, dst, src, op):
            raise RuntimeError("program_source:3:1: error: unknown type name 'kernal'")

    decisions, _ = decide_all([NoCompiler()], on())
    assert decisions[0].device is None
    assert decisions[0].reason == ("stand-in self-test failed: raised RuntimeError: program_source:3:1: "
                                   "error: unknown type name 'kernal'")


def test_device_failure_later_falls_back_and_logs_once(caplog):
    caplog.set_level(logging.INFO, logger="lightning_mccl.metal")
    breaks = Breaks()
    decisions, paths = decide_all([breaks], on(mode="1"))
    assert decisions[0].device == "stand-in"
    breaks.armed = True
    for _ in range(3):
        dst = torch.ones(64, dtype=torch.bfloat16)
        assert paths[0].reduce_(dst, torch.ones(64, dtype=torch.bfloat16), "sum") == "cpu"
        assert dst.float().tolist() == [2.0] * 64
    failures = [r for r in caplog.records if "MTLCommandBuffer failed" in r.message]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING  # MCCL_METAL=1: a warning
    assert paths[0].decide().device is None and "the CPU reducer" not in paths[0].decide().reason


# ---- the Metal library's source (compiled on a Mac only)

def test_msl_source_has_the_header_and_one_kernel_per_dtype_and_op():
    src = kernels.msl_source()
    assert src.startswith(kernels.HEADER.read_text())
    for dtype in ("float32", "float16", "bfloat16"):
        for op in ("sum", "product", "min", "max"):
            assert f"kernel void mccl_{dtype}_{op}(" in src
    assert kernels.kernel_name("float16", "avg") == "mccl_float16_sum"
    assert "mccl_reduce_bf16(MCCL_OP_MAX, dst[i], src[i])" in src


@pytest.mark.skipif(kernels.unavailable_reason() is None, reason="Metal is available: tests/macos covers it")
def test_metal_says_why_it_is_unavailable_here():
    assert kernels.MetalReducer().unavailable_reason() == kernels.unavailable_reason()
    assert kernels.unavailable_reason().startswith(("not macOS", "torch.backends.mps", "torch "))
