"""MCCLStrategy: real fits compared with Lightning's DDP over Gloo, and the MPS path on an MPS stand-in.

Fits (subprocesses, started together, one hard deadline): fit_script.py trains a tiny deterministic model
for 6 steps on 2 CPU ranks. Lightning's `strategy="ddp"` (Gloo) is the reference; the mccl runs must give
the same parameters (allclose 1e-6) through `Trainer(strategy="mccl")`, an `MCCLStrategy` instance with
accelerator="auto", LightningCLI (`--trainer.strategy mccl` and the `class_path` form), torchrun and
`mccl launch --local 1 --nproc-per-node 2`.
`compress="bf16_hook"` must equal MCCLStrategy(process_group_backend="gloo", compress="bf16") and differ from
the uncompressed result (so the hook really ran on CPU, where DDPStrategy registers none); `mccl_bf16_compress`
(the engine's wire compression, no hook) must stay within bf16's error bound of the uncompressed result and
differ from it; `compress="powersgd"` must equal the same PowerSGD over Gloo.

MPS (in this process, no fit): MPS is reported available the way Lightning's own tests do it. Lightning
refuses its DDP there (checked, so the stand-in is known to work); MCCLStrategy passes the connector as a
name and as an instance, initialises its group without device_id, wraps the model without a CUDA stream,
registers its comm hook (which then runs) and has its group destroyed at exit.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from launch_env import HERE, clean_env, free_port

SCRIPT = os.path.join(HERE, "fit_script.py")
FIT_DEADLINE_S = 240  # all launches together; measured ~30 s on 2 cores
ATOL = RTOL = 1e-6

LAUNCHES = {
    "lightning_ddp": lambda out: [sys.executable, SCRIPT, out, "ddp", "gloo_bf16", "gloo_powersgd"],
    "lightning_mccl": lambda out: [sys.executable, SCRIPT, out, "mccl", "mccl_bf16_hook", "instance",
                                   "cli_string", "cli_class_path", "mccl_powersgd"],
    "lightning_mccl_wire": lambda out: [sys.executable, SCRIPT, out, "mccl_bf16_compress"],
    "torchrun": lambda out: [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                             SCRIPT, out, "mccl", "--lightning-first"],
    # the package's own launcher: one "host" (this machine) running 2 ranks, as a newcomer would
    "mccl_launch": lambda out: [sys.executable, "-m", "lightning_mccl.cli", "launch", "--local", "1",
                                "--nproc-per-node", "2", "--", sys.executable, SCRIPT, out, "mccl"],
}


def _kill_group(proc: subprocess.Popen) -> None:
    """The launch and every rank it started (they share its new session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            pass


class Fits:
    def __init__(self, root: str) -> None:
        self.root = root
        self.records = {}
        for path in glob.glob(os.path.join(root, "*", "*.rank*.pt")):
            launch = os.path.basename(os.path.dirname(path))
            run, rank = os.path.basename(path)[: -len(".pt")].split(".rank")
            self.records[(launch, run, int(rank))] = torch.load(path)
        self.init = torch.load(os.path.join(root, "lightning_ddp", "init.pt"))

    def exit_record(self, launch: str, rank: int) -> dict:
        return self.record(launch, "exit", rank)

    def record(self, launch: str, run: str, rank: int) -> dict:
        key = (launch, run, rank)
        assert key in self.records, f"{launch} wrote no result for run {run!r} rank {rank}; have {sorted(self.records)}"
        return self.records[key]


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fits"))
    procs = {}
    try:
        for name, command in LAUNCHES.items():
            out = os.path.join(root, name)
            os.makedirs(out)
            log = open(os.path.join(root, f"{name}.log"), "w")
            procs[name] = (subprocess.Popen(command(out), cwd=root, env=clean_env(), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True), log)
        deadline = time.monotonic() + FIT_DEADLINE_S
        failures = []
        for name, (proc, log) in procs.items():
            try:
                rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rc = f"still running after {FIT_DEADLINE_S} s (killed)"
            if rc != 0:
                failures.append((name, rc))
    finally:
        for proc, log in procs.values():
            _kill_group(proc)
            log.close()
    if failures:
        report = []
        for name, rc in failures:
            with open(os.path.join(root, f"{name}.log")) as f:
                report.append(f"--- {name}: exit {rc}\n{f.read()[-6000:]}")
        pytest.fail("fit launches failed:\n" + "\n".join(report), pytrace=False)
    return Fits(root)


def assert_params_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=ATOL, rtol=RTOL, msg=lambda m: f"{key}: {m}")


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def reference(fits: Fits) -> dict:
    ref = fits.record("lightning_ddp", "ddp", 0)
    assert (ref["backend"], ref["strategy"], ref["world_size"]) == ("gloo", "DDPStrategy", 2)
    assert max_diff(ref["params"], fits.init) > 1e-2, "the reference run did not train"
    return ref


def test_mccl_group_is_destroyed_at_exit_unlike_lightnings_gloo_group(fits):
    """Obstacle (e): Lightning destroys only NCCL groups at exit; MCCLStrategy has its group destroyed too."""
    for rank in (0, 1):
        assert fits.exit_record("lightning_ddp", rank)["initialized_at_exit"] is True
        assert fits.exit_record("lightning_mccl", rank)["initialized_at_exit"] is False
        assert fits.exit_record("torchrun", rank)["initialized_at_exit"] is False


@pytest.mark.parametrize("launch,run,environment", [
    ("lightning_mccl", "mccl", "LightningEnvironment"),
    ("lightning_mccl", "instance", "LightningEnvironment"),
    ("lightning_mccl", "cli_string", "LightningEnvironment"),
    ("lightning_mccl", "cli_class_path", "LightningEnvironment"),
    ("torchrun", "mccl", "TorchElasticEnvironment"),
    ("mccl_launch", "mccl", "TorchElasticEnvironment"),  # mccl launch marks its ranks as torchrun does
])
def test_fit_over_mccl_equals_lightning_ddp_over_gloo(fits, launch, run, environment):
    ref = reference(fits)
    for rank in (0, 1):
        rec = fits.record(launch, run, rank)
        used = {k: rec[k] for k in ("backend", "strategy", "environment", "world_size", "comm_hooks",
                                    "bound_device_id", "process_group_after_fit")}
        assert used == {"backend": "mccl", "strategy": "MCCLStrategy", "environment": environment, "world_size": 2,
                        "comm_hooks": [], "bound_device_id": "None", "process_group_after_fit": True}
        assert rec["engine_wire"] == "off"
        assert_params_close(rec["params"], ref["params"])
        assert rec["registered_by_import"] is True
    assert fits.record("torchrun", "mccl", 0)["lightning_first"] is True  # the other import order
    assert fits.record("lightning_mccl", "mccl", 0)["lightning_first"] is False


def test_bf16_compress_hook_runs_on_cpu_and_matches_gloo(fits):
    plain = reference(fits)
    gloo = fits.record("lightning_ddp", "gloo_bf16", 0)
    assert (gloo["backend"], gloo["comm_hooks"]) == ("gloo", ["bf16_compress_hook"])
    for rank in (0, 1):
        rec = fits.record("lightning_mccl", "mccl_bf16_hook", rank)
        assert (rec["backend"], rec["comm_hooks"]) == ("mccl", ["bf16_compress_hook"])
        assert_params_close(rec["params"], gloo["params"])
        # bf16 gradients change the result (measured 3.7e-4): the hook ran
        assert max_diff(rec["params"], plain["params"]) > 1e-5


def test_bf16_wire_compression_stays_within_bf16_error_of_gloo(fits):
    """compress="bf16" over mccl: no hook, the engine sends bf16 (2 ranks: each gradient rounded at most 3
    times, u = 2^-8); the weights stay within 2 x 3u of the training's movement from the exact result."""
    plain = reference(fits)
    moved = max_diff(plain["params"], fits.init)
    for rank in (0, 1):
        rec = fits.record("lightning_mccl_wire", "mccl_bf16_compress", rank)
        assert (rec["backend"], rec["comm_hooks"], rec["engine_wire"]) == ("mccl", [], "bf16")
        diff = max_diff(rec["params"], plain["params"])
        assert 1e-6 < diff <= 2 * 3 * 2.0**-8 * moved, (diff, moved)
    assert max_diff(fits.record("lightning_mccl_wire", "mccl_bf16_compress", 1)["params"],
                    fits.record("lightning_mccl_wire", "mccl_bf16_compress", 0)["params"]) == 0


def test_powersgd_runs_and_matches_gloo(fits):
    plain = reference(fits)
    gloo = fits.record("lightning_ddp", "gloo_powersgd", 0)
    for rank in (0, 1):
        rec = fits.record("lightning_mccl", "mccl_powersgd", rank)
        assert (rec["backend"], rec["comm_hooks"]) == ("mccl", ["powerSGD_hook"])
        torch.testing.assert_close(rec["params"], gloo["params"], atol=1e-5, rtol=1e-5)
        assert max_diff(rec["params"], plain["params"]) > 1e-4  # the low-rank approximation trained differently


# ---------------------------------------------------------------------------------------------------------
# In this process: registry, arguments, and the MPS path on a stand-in


def make_trainer(strategy, accelerator, root, **kwargs):
    import lightning as L

    return L.Trainer(strategy=strategy, accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), **kwargs)


def test_registered_names_mirror_lightning_ddp_without_ddp():
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    from lightning_mccl.lightning import MCCLStrategy

    expected = {
        "mccl": {"start_method": "popen"},
        "mccl_spawn": {"start_method": "spawn"},
        "mccl_find_unused_parameters_true": {"find_unused_parameters": True, "start_method": "popen"},
        "mccl_find_unused_parameters_false": {"find_unused_parameters": False, "start_method": "popen"},
        "mccl_spawn_find_unused_parameters_true": {"find_unused_parameters": True, "start_method": "spawn"},
        "mccl_spawn_find_unused_parameters_false": {"find_unused_parameters": False, "start_method": "spawn"},
        "mccl_bf16_compress": {"compress": "bf16"},
        "mccl_fp16_compress": {"compress": "fp16"},
    }
    ours = {n for n in StrategyRegistry.available_strategies() if StrategyRegistry[n]["strategy"] is MCCLStrategy}
    assert ours == set(expected)
    for name, params in expected.items():
        assert "ddp" not in name
        assert StrategyRegistry[name]["init_params"] == params
        strategy = StrategyRegistry.get(name)
        assert type(strategy) is MCCLStrategy and strategy.process_group_backend == "mccl"
        assert strategy._ddp_kwargs["find_unused_parameters"] is params.get("find_unused_parameters", False)
    # every popen/spawn registration of DDPStrategy has its mccl twin (fork ones are left out on purpose)
    ddp_names = {n for n in StrategyRegistry.available_strategies() if StrategyRegistry[n]["strategy"] is DDPStrategy}
    assert {n.replace("ddp", "mccl") for n in ddp_names if "fork" not in n and "notebook" not in n} <= ours


def test_arguments_compress_timeout_ddp_kwargs_and_hint():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from lightning_mccl.lightning import MCCLStrategy

    s = MCCLStrategy(compress="fp16")  # the engine's wire compression: no hook
    assert (s._ddp_comm_hook, s._ddp_comm_wrapper, s._compress_plan.wire) == (None, None, "fp16")
    s.parallel_devices = [torch.device("cpu")]
    s._choose_compression()  # a CPU root device keeps the engine's compression
    assert (s._ddp_comm_hook, s._compress_plan.wire) == (None, "fp16")
    s = MCCLStrategy(compress="fp16", process_group_backend="gloo")  # no engine: torch's hook
    assert (s._ddp_comm_hook, s._compress_plan.wire) == (default_hooks.fp16_compress_hook, None)
    s = MCCLStrategy(compress="fp16_hook")
    assert (s._ddp_comm_hook, s._ddp_comm_wrapper) == (default_hooks.fp16_compress_hook, None)
    s = MCCLStrategy(compress="bf16_hook", ddp_comm_hook=powerSGD_hook.powerSGD_hook)
    assert (s._ddp_comm_hook, s._ddp_comm_wrapper) == (powerSGD_hook.powerSGD_hook, default_hooks.bf16_compress_wrapper)
    s = MCCLStrategy(compress="powersgd", compress_options={"matrix_approximation_rank": 4})
    assert s._ddp_comm_hook is powerSGD_hook.powerSGD_hook and s._compress_plan.wire is None
    state = s._ddp_comm_state
    assert isinstance(state, powerSGD_hook.PowerSGDState) and state.process_group is None
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter, state.use_error_feedback,
            state.warm_start) == (4, 10, True, True)
    assert MCCLStrategy()._ddp_comm_hook is None
    with pytest.raises(ValueError, match=r"compress='int8'\): expected one of \('bf16', 'fp16', 'bf16_hook'"):
        MCCLStrategy(compress="int8")
    with pytest.raises(ValueError, match="give either compress or ddp_comm_wrapper"):
        MCCLStrategy(compress="bf16_hook", ddp_comm_hook=powerSGD_hook.powerSGD_hook,
                     ddp_comm_wrapper=default_hooks.fp16_compress_wrapper)
    with pytest.raises(ValueError, match=r"\['rank'\] are not PowerSGDState arguments"):
        MCCLStrategy(compress="powersgd", compress_options={"rank": 4})
    with pytest.raises(ValueError, match="takes no compress_options"):
        MCCLStrategy(compress="bf16", compress_options={"warm_start": False})
    with pytest.raises(ValueError, match="leave ddp_comm_hook"):
        MCCLStrategy(compress="powersgd", ddp_comm_hook=powerSGD_hook.powerSGD_hook)
    assert MCCLStrategy(timeout=90)._timeout == timedelta(seconds=90)
    assert MCCLStrategy(timeout=timedelta(minutes=2))._timeout == timedelta(minutes=2)
    for bad in (0, -1, "soon", True):
        with pytest.raises(ValueError, match="timeout"):
            MCCLStrategy(timeout=bad)
    error = RuntimeError("Expected to have finished reduction in the prior iteration before starting a new one.")
    MCCLStrategy().on_exception(error)
    assert "strategy='mccl_find_unused_parameters_true'" in str(error)
    s = MCCLStrategy(static_graph=True, bucket_cap_mb=4, forward_sync_buffers=False)
    assert s._ddp_kwargs == {"find_unused_parameters": False, "static_graph": True, "gradient_as_bucket_view": False,
                             "bucket_cap_mb": 4, "forward_sync_buffers": False}


def test_wire_compression_conflicts_are_named(monkeypatch):
    from lightning_mccl import _backend
    from lightning_mccl.lightning import compress

    monkeypatch.setenv("MCCL_WIRE_DTYPE", "fp16")
    monkeypatch.setattr(_backend, "_engine_wire", None)
    with pytest.raises(ValueError, match="compress='bf16'\\) but MCCL_WIRE_DTYPE=fp16 in the environment"):
        compress.set_engine_wire("bf16")
    compress.set_engine_wire("float16")  # the same setting, spelled as the engine also accepts it
    monkeypatch.delenv("MCCL_WIRE_DTYPE")
    monkeypatch.setattr(_backend, "_engine_wire", "off")  # a group started earlier, uncompressed
    with pytest.raises(ValueError, match="already started with MCCL_WIRE_DTYPE=off"):
        compress.set_engine_wire("bf16")
    compress.set_engine_wire(None)  # compress unset: nothing to check
    monkeypatch.setattr(_backend, "_engine_wire", None)
    compress.set_engine_wire("bf16")
    assert os.environ["MCCL_WIRE_DTYPE"] == "bf16"


def test_lightning_refuses_its_ddp_on_the_mps_stand_in(mps_stand_in, tmp_path):
    """Obstacle (a) as Lightning has it: the stand-in really makes the connector see MPS."""
    from lightning.pytorch.strategies import DDPStrategy

    for strategy in ("ddp", "ddp_spawn", DDPStrategy()):
        for accelerator in ("mps", "auto"):
            with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
                make_trainer(strategy, accelerator, tmp_path)


@pytest.mark.parametrize("accelerator", ["mps", "auto"])
@pytest.mark.parametrize("strategy", ["mccl", "mccl_bf16_compress", "instance"])
def test_mccl_passes_the_connector_on_mps(mps_stand_in, tmp_path, strategy, accelerator):
    from lightning.pytorch.accelerators import MPSAccelerator
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.trainer.connectors import accelerator_connector

    from lightning_mccl.lightning import MCCLStrategy

    trainer = make_trainer(MCCLStrategy(compress="fp16") if strategy == "instance" else strategy, accelerator, tmp_path)
    assert type(trainer.strategy) is MCCLStrategy
    assert isinstance(trainer.accelerator, MPSAccelerator)
    assert trainer.strategy.root_device == torch.device("mps", 0)
    assert trainer.strategy.process_group_backend == "mccl"
    assert trainer.strategy.determine_ddp_device_ids() is None
    # the gate is closed again for everybody else
    assert accelerator_connector.MPSAccelerator is MPSAccelerator
    with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
        make_trainer(DDPStrategy(), accelerator, tmp_path)


def test_lightning_cli_on_mps_string_and_class_path(mps_stand_in, tmp_path):
    from lightning.pytorch.accelerators import MPSAccelerator
    from lightning.pytorch.cli import LightningCLI

    from fit_script import TinyModel
    from lightning_mccl.lightning import MCCLStrategy

    common = ["--trainer.accelerator=mps", "--trainer.devices=1", "--trainer.logger=false",
              f"--trainer.default_root_dir={tmp_path}"]
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent("""
        trainer:
          strategy:
            class_path: lightning_mccl.lightning.MCCLStrategy
            init_args:
              compress: bf16
              timeout: 60
    """))
    with mock.patch.object(sys, "argv", ["train.py"]):
        cli = LightningCLI(TinyModel, run=False, save_config_callback=None, args=common + [f"--config={config}"])
        strategy = cli.trainer.strategy
        assert type(strategy) is MCCLStrategy and isinstance(cli.trainer.accelerator, MPSAccelerator)
        assert (strategy.compress, strategy._ddp_comm_hook, strategy._compress_plan.wire) == ("bf16", None, "bf16")
        strategy._choose_compression()  # at setup: the root device is MPS, so torch's hook casts on the device
        assert (strategy._ddp_comm_hook, strategy._compress_plan.wire) == (default_hooks.bf16_compress_hook, None)
        assert strategy._timeout == timedelta(seconds=60)
        cli = LightningCLI(TinyModel, run=False, save_config_callback=None,
                           args=common + ["--trainer.strategy=mccl_fp16_compress"])
        assert type(cli.trainer.strategy) is MCCLStrategy and cli.trainer.strategy.compress == "fp16"
        assert cli.trainer.strategy.root_device == torch.device("mps", 0)


def test_setup_on_mps_binds_no_device_creates_no_cuda_stream_and_registers_the_hook(mps_stand_in, tmp_path):
    """Obstacles (b), (c), (d), (e) with a real mccl group of one rank; the module stays on the CPU (there
    is no MPS here), the strategy's root device is MPS."""
    import atexit

    from lightning_mccl.lightning import strategy as strategy_module

    from lightning.fabric.utilities.distributed import _InfiniteBarrier

    from fit_script import IN, TinyModel
    from lightning_mccl.lightning import MCCLStrategy

    mps_stand_in.setenv("MASTER_ADDR", "127.0.0.1")
    mps_stand_in.setenv("MASTER_PORT", str(free_port()))
    init_calls = []
    real_init = dist.init_process_group

    def init_spy(*args, **kwargs):
        init_calls.append(kwargs)
        return real_init(*args, **kwargs)

    def no_cuda_stream(*args, **kwargs):
        raise AssertionError("torch.cuda.Stream() was created")

    buckets = []

    def hook_spy(state, bucket):
        buckets.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    at_exit = []
    mps_stand_in.setattr(atexit, "register", at_exit.append)
    mps_stand_in.setattr(strategy_module, "_destroy_registered", False)
    mps_stand_in.setattr(dist, "init_process_group", init_spy)
    mps_stand_in.setattr(torch.cuda, "Stream", no_cuda_stream)
    strategy = make_trainer(MCCLStrategy(ddp_comm_hook=hook_spy, timeout=60), "mps", tmp_path).strategy
    assert strategy.root_device == torch.device("mps", 0)
    try:
        strategy.setup_distributed()
        assert len(init_calls) == 1 and "device_id" not in init_calls[0], init_calls  # (b)
        assert init_calls[0]["timeout"] == timedelta(seconds=60)
        assert dist.get_backend() == "mccl" and dist.group.WORLD.bound_device_id is None
        assert at_exit == [strategy_module.destroy_at_exit]  # (e)
        with _InfiniteBarrier():  # Lightning's Gloo group next to ours: unbound, so Gloo can run it
            pass

        module = TinyModel()
        strategy.connect(module)
        strategy.configure_ddp()  # (c): no CUDA stream, no device_ids
        ddp = strategy.model
        assert isinstance(ddp, DistributedDataParallel) and ddp.device_ids is None
        assert [hook for hook, _ in ddp._comm_hooks] == [hook_spy]  # (d)
        x = torch.randn(4, IN)
        ddp(x).square().sum().backward()
        assert buckets, "the registered comm hook did not run"
        expected = torch.func.grad(lambda p: torch.func.functional_call(module, p, (x,)).square().sum())(
            {k: v.detach() for k, v in module.named_parameters()})
        for name, param in module.named_parameters():
            torch.testing.assert_close(param.grad, expected[name], atol=1e-6, rtol=1e-6)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_lightning_ddp_strategy_on_mps_shows_the_obstacles(monkeypatch, no_launch_env):
    """What MCCLStrategy overrides, as Lightning's DDPStrategy does it with an MPS root device: device_id is
    passed (b), [0] becomes device_ids and a CUDA stream is created (c), and no comm hook is registered (d)."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    from fit_script import TinyModel
    from lightning_mccl.lightning import MCCLStrategy

    mps = torch.device("mps", 0)

    class Stop(Exception):
        pass

    init_calls = []

    def init_spy(*args, **kwargs):
        init_calls.append(kwargs)
        raise Stop

    def no_cuda_stream(*args, **kwargs):
        raise AssertionError("torch.cuda.Stream() was created")

    monkeypatch.setattr(dist, "init_process_group", init_spy)
    monkeypatch.setattr(torch.cuda, "Stream", no_cuda_stream)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    def strategy(cls):
        return cls(parallel_devices=[mps], cluster_environment=LightningEnvironment(), process_group_backend="mccl",
                   ddp_comm_hook=default_hooks.allreduce_hook)

    ddp_strategy, mccl_strategy = strategy(DDPStrategy), strategy(MCCLStrategy)
    for s in (ddp_strategy, mccl_strategy):
        with pytest.raises(Stop):
            s.setup_distributed()
    import lightning
    from packaging.version import Version

    binds = Version(lightning.__version__) >= Version("2.6")  # DDPStrategy passes device_id since Lightning 2.6
    assert init_calls[0].get("device_id") == (mps if binds else None) and "device_id" not in init_calls[1]

    assert ddp_strategy.determine_ddp_device_ids() == [0]
    with pytest.raises(AssertionError, match=r"torch\.cuda\.Stream\(\) was created"):
        ddp_strategy._setup_model(TinyModel())

    for s in (ddp_strategy, mccl_strategy):
        s.model = mock.create_autospec(DistributedDataParallel, instance=True)
        s._register_ddp_hooks()
    ddp_strategy.model.register_comm_hook.assert_not_called()
    mccl_strategy.model.register_comm_hook.assert_called_once_with(state=None, hook=default_hooks.allreduce_hook)


def test_import_registers_lazily_and_a_failed_registration_only_warns():
    """`import lightning_mccl` does not import Lightning; importing lightning.pytorch afterwards registers the
    names; if registering fails, Lightning still imports and a warning says why."""
    code = textwrap.dedent("""
        import sys, warnings
        import lightning_mccl
        print("lightning" in sys.modules)
        sys.modules["lightning_mccl.lightning.strategy"] = None  # make the registration fail
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from lightning.pytorch.strategies import StrategyRegistry
        print("mccl" in StrategyRegistry)
        print([str(w.message) for w in caught if "lightning-mccl" in str(w.message)])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["False", "False"], proc.stdout
    assert "the 'mccl' Lightning strategies were not registered" in lines[2], proc.stdout
