"""MCCLStrategy in this process, without a fit: the names it registers with Lightning (mirroring DDPStrategy's,
without "ddp"), its arguments (compress, compress_options, timeout, DDP keyword arguments) and their errors,
the wire-compression conflicts, and the lazy registration at import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from launch_env import clean_env


def _registered(registry, cls) -> dict:
    """{name: init_params} of the registry's names whose strategy is `cls` (registered as a factory that imports
    it on first use, so the class is found by making one)."""
    return {n: registry[n]["init_params"] for n in registry.available_strategies() if n.startswith("mccl")
            and type(registry.get(n)) is cls}


def test_registered_names_mirror_lightning_ddp_without_ddp():
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    from lightning_mccl.lightning import (MCCLDiLoCoStrategy, MCCLElasticDiLoCoStrategy, MCCLElasticStrategy,
                                          MCCLStrategy)

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
    ours = _registered(StrategyRegistry, MCCLStrategy)
    assert ours == expected
    for name, params in expected.items():
        assert "ddp" not in name
        strategy = StrategyRegistry.get(name)
        assert type(strategy) is MCCLStrategy and strategy.process_group_backend == "mccl"
        assert strategy._ddp_kwargs["find_unused_parameters"] is params.get("find_unused_parameters", False)
    assert _registered(StrategyRegistry, MCCLDiLoCoStrategy) == {"mccl_diloco": {"start_method": "popen"}}
    assert _registered(StrategyRegistry, MCCLElasticStrategy) == {"mccl_elastic": {"start_method": "popen"}}
    assert _registered(StrategyRegistry, MCCLElasticDiLoCoStrategy) == {
        "mccl_elastic_diloco": {"start_method": "popen"}}
    # every popen/spawn registration of DDPStrategy has its mccl twin (fork ones are left out on purpose)
    ddp_names = {n for n in StrategyRegistry.available_strategies() if StrategyRegistry[n]["strategy"] is DDPStrategy}
    assert {n.replace("ddp", "mccl") for n in ddp_names if "fork" not in n and "notebook" not in n} <= set(ours)


def test_fabric_registers_the_same_table_without_diloco():
    """One table (names.py) for both registries: Fabric has every name of the Trainer's DDP strategy, each with
    the same arguments (DiLoCo and the elastic strategies are the Trainer's only)."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_mccl.lightning import MCCLFabricStrategy, MCCLStrategy

    trainer = _registered(StrategyRegistry, MCCLStrategy)
    assert _registered(STRATEGY_REGISTRY, MCCLFabricStrategy) == trainer
    assert not {"mccl_diloco", "mccl_elastic", "mccl_elastic_diloco"} & set(STRATEGY_REGISTRY)
    strategy = STRATEGY_REGISTRY.get("mccl_spawn_find_unused_parameters_true")
    assert type(strategy) is MCCLFabricStrategy and strategy._ddp_kwargs["find_unused_parameters"] is True
    assert STRATEGY_REGISTRY.get("mccl_bf16_compress").compress == "bf16"


def test_the_front_ends_share_the_group_module_and_not_each_other():
    """strategy.py, diloco_strategy.py and fabric.py import the group setup from group.py (the Trainer's two through
    base.py), never from each other (no cycle)."""
    import ast
    from pathlib import Path

    import lightning_mccl.lightning as package

    here = Path(package.__file__).parent
    fronts = ("strategy", "diloco_strategy", "fabric")
    for module in fronts:
        tree = ast.parse((here / f"{module}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
                    for alias in node.names} | {node.module for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert not imported & (set(fronts) - {module}) and "group" in imported, (module, imported)


def _resolved(strategy, device="cpu"):
    """What the strategy resolves at setup for a root device of `device` (wire_policy.resolve), and the DDP hook it
    then builds."""
    from lightning_mccl import wire_policy
    from lightning_mccl.lightning import hooks

    wire = wire_policy.resolve(strategy.compress, device, strategy._get_process_group_backend(), "MCCLStrategy")
    return wire, hooks.build("MCCLStrategy", wire, strategy.compress_options, strategy._ddp_comm_hook,
                             strategy._ddp_comm_wrapper, strategy._ddp_comm_state)


def test_arguments_compress_timeout_ddp_kwargs_and_hint():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from lightning_mccl.lightning import MCCLStrategy

    wire, hook = _resolved(MCCLStrategy(compress="fp16"))  # on the CPU: the engine's wire compression, no hook
    assert (hook.hook, hook.wrapper, wire.wire) == (None, None, "fp16")
    wire, hook = _resolved(MCCLStrategy(compress="fp16"), "mps")  # on an accelerator: torch's hook casts there
    assert (hook.hook, wire.wire) == (default_hooks.fp16_compress_hook, None)
    wire, hook = _resolved(MCCLStrategy(compress="fp16", process_group_backend="gloo"))  # no engine: the hook
    assert (hook.hook, wire.wire) == (default_hooks.fp16_compress_hook, None)
    _, hook = _resolved(MCCLStrategy(compress="fp16_hook"))
    assert (hook.hook, hook.wrapper) == (default_hooks.fp16_compress_hook, None)
    _, hook = _resolved(MCCLStrategy(compress="bf16_hook", ddp_comm_hook=powerSGD_hook.powerSGD_hook))
    assert (hook.hook, hook.wrapper) == (powerSGD_hook.powerSGD_hook, default_hooks.bf16_compress_wrapper)
    wire, hook = _resolved(MCCLStrategy(compress="powersgd", compress_options={"matrix_approximation_rank": 4}))
    assert hook.hook is powerSGD_hook.powerSGD_hook and wire.wire is None
    state = hook.state
    assert isinstance(state, powerSGD_hook.PowerSGDState) and state.process_group is None
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter, state.use_error_feedback,
            state.warm_start) == (4, 10, True, True)
    assert _resolved(MCCLStrategy())[1].hook is None
    with pytest.raises(ValueError, match=r"compress='int4'\): expected one of \('bf16', 'fp16', 'bf16_hook'"):
        MCCLStrategy(compress="int4")
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
    # The fleet default over mccl (the wire policy's row); other backends keep DDP's own.
    assert _resolved(MCCLStrategy())[0].bucket_mb == 5.0
    assert _resolved(MCCLStrategy(compress="int8"))[0].bucket_mb == 25.0
    assert _resolved(MCCLStrategy(compress="powersgd"))[0].bucket_mb == 1000.0  # one bucket
    assert _resolved(MCCLStrategy(compress="bf16_hook"))[0].bucket_mb == 5.0
    assert _resolved(MCCLStrategy(compress="powersgd", process_group_backend="gloo"))[0].bucket_mb is None
    assert _resolved(MCCLStrategy(process_group_backend="gloo"))[0].bucket_mb is None


@pytest.mark.filterwarnings("ignore:Complex modules")
def test_int8_brings_its_hook_and_refuses_what_it_cannot_take():
    """compress="int8": the engine's 8-bit hook and its state; mccl only, no other hook, floating gradients only."""
    from lightning_mccl import int8
    from lightning_mccl.lightning import MCCLStrategy

    wire, hook = _resolved(MCCLStrategy(compress="int8"))
    assert hook.hook is int8.int8_hook and isinstance(hook.state, int8.Int8State)
    assert (hook.wrapper, wire.wire, wire.bucket_mb) == (None, None, 25.0)
    assert _resolved(MCCLStrategy(compress="int8"), "mps")[1].hook is int8.int8_hook  # on every device
    hook.check(torch.nn.Linear(2, 2).to(torch.bfloat16))  # floating: fine
    with pytest.raises(ValueError, match=r"compress='int8'\): parameter 'weight' is torch.complex64"):
        hook.check(torch.nn.Linear(2, 2).to(torch.complex64))
    with pytest.raises(ValueError, match="compress='int8'\\) needs process_group_backend='mccl'"):
        MCCLStrategy(compress="int8", process_group_backend="gloo")
    with pytest.raises(ValueError, match="brings its own hook and state"):
        MCCLStrategy(compress="int8", ddp_comm_hook=default_hooks.bf16_compress_hook)


@pytest.mark.parametrize("name", ["MCCLStrategy", "MCCLDiLoCoStrategy", "MCCLFabricStrategy"])
def test_timeout_is_a_timedelta_or_a_positive_number_of_seconds(name):
    import lightning_mccl.lightning

    cls = getattr(lightning_mccl.lightning, name)
    assert cls(timeout=1.5)._timeout == timedelta(seconds=1.5)
    assert cls(timeout=timedelta(minutes=2))._timeout == timedelta(minutes=2)
    assert cls(timeout=None)._timeout is None
    for bad in (0, -1, "soon", True):
        with pytest.raises(ValueError) as info:
            cls(timeout=bad)
        assert str(info.value) == f"{name}(timeout={bad!r}): expected a timedelta or a positive number of seconds"


def test_wire_compression_conflicts_are_named(monkeypatch):
    from functools import partial

    from lightning_mccl.lightning import group

    wire_settings = partial(group.wire_settings, "MCCLStrategy")
    monkeypatch.setenv("MCCL_WIRE_DTYPE", "fp16")
    with pytest.raises(ValueError, match="compress='bf16'\\) but MCCL_WIRE_DTYPE=fp16 in the environment"):
        wire_settings("bf16", None)
    # the same setting, spelled as the engine also accepts it
    assert wire_settings("float16", None) == {"MCCL_WIRE_DTYPE": "float16"}
    monkeypatch.setenv("MCCL_WIRE_DTYPE", "float16")
    assert wire_settings("fp16", "fp16") == {"MCCL_WIRE_DTYPE": "fp16"}
    assert os.environ["MCCL_WIRE_DTYPE"] == "float16"  # left as it was
    monkeypatch.delenv("MCCL_WIRE_DTYPE")
    # a default group made earlier, uncompressed, that this fit would reuse
    with pytest.raises(ValueError) as info:
        wire_settings("bf16", "off")
    assert "existing default process group, which this fit reuses, was made with MCCL_WIRE_DTYPE=off" in str(info.value)
    assert "torch.distributed.destroy_process_group() before this fit" in str(info.value)
    assert wire_settings("bf16", "bfloat16") == {"MCCL_WIRE_DTYPE": "bf16"}
    # compress unset after a compressed fit whose group this fit reuses: the group would train compressed
    with pytest.raises(ValueError) as info:
        wire_settings(None, "bf16")
    assert ("MCCLStrategy(compress=None): the existing default process group, which this fit reuses, was made with "
            "MCCL_WIRE_DTYPE=bf16, but the environment says MCCL_WIRE_DTYPE=off (unset)") in str(info.value)
    assert "or pass compress='bf16'" in str(info.value)
    assert wire_settings(None, "off") == {}  # compress unset, and the group agrees with the environment
    monkeypatch.setenv("MCCL_WIRE_DTYPE", "bfloat16")
    assert wire_settings(None, "bf16") == {}  # the environment decides, and the group read the same
    with pytest.raises(ValueError, match=r"made with MCCL_WIRE_DTYPE=off, but the environment says "
                                         r"MCCL_WIRE_DTYPE=bfloat16 .* or remove MCCL_WIRE_DTYPE from the environment"):
        wire_settings(None, "off")
    monkeypatch.setenv("MCCL_WIRE_DTYPE", "fp16")
    with pytest.raises(ValueError, match=r"or set MCCL_WIRE_DTYPE=bf16 to train as that group does"):
        wire_settings(None, "bf16")
    monkeypatch.delenv("MCCL_WIRE_DTYPE")
    assert wire_settings(None, None) == {}
    assert wire_settings("bf16", None) == {"MCCL_WIRE_DTYPE": "bf16"}
    assert "MCCL_WIRE_DTYPE" not in os.environ  # never written


def test_import_registers_lazily_and_a_failed_registration_only_warns():
    """`import lightning_mccl` does not import Lightning; importing lightning.pytorch afterwards registers the
    names; if registering fails, Lightning still imports and a warning says why."""
    code = textwrap.dedent("""
        import sys, warnings
        import lightning_mccl
        print("lightning" in sys.modules)
        sys.modules["lightning_mccl.lightning.names"] = None  # make the registration fail
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


@pytest.mark.parametrize("first", ["MCCLStrategy", "MCCLDiLoCoStrategy", "CommMetrics", "MacFleetEnvironment",
                                   "MCCLFabricStrategy"])
def test_any_name_imported_first_registers_both_strategy_registries(first):
    """Whichever module of lightning_mccl.lightning imports Lightning first (its import then runs inside that
    module's), the Trainer's and Fabric's "mccl" names end up registered, with no warning."""
    code = textwrap.dedent(f"""
        import warnings
        warnings.simplefilter("error")
        from lightning_mccl.lightning import {first}
        from lightning.pytorch.strategies import StrategyRegistry
        from lightning.fabric.strategies import STRATEGY_REGISTRY
        print("mccl" in StrategyRegistry, "mccl" in STRATEGY_REGISTRY)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"], proc.stdout + proc.stderr


def test_options_reach_the_process_group(no_launch_env):
    """`MCCLStrategy(options=...)` become the default group's pg_options, which the engine reads when the group
    is made: a count with a byte suffix is refused there, naming the variable. The wire type stays compress='s."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    from lightning_mccl.launcher import free_port
    from lightning_mccl import Options
    from lightning_mccl.lightning import MCCLStrategy

    with pytest.raises(ValueError, match=r"MCCL_WIRE_DTYPE is chosen by compress="):
        MCCLStrategy(options={"MCCL_WIRE_DTYPE": "bf16"})
    with pytest.raises(ValueError, match=r"'SPIN_US' is not an MCCL_\* variable name"):
        MCCLStrategy(options={"SPIN_US": 0})
    assert MCCLStrategy(options=Options(spin_us=0)).options.settings == {"MCCL_SPIN_US": "0"}

    no_launch_env.setenv("MASTER_PORT", str(free_port()))
    strategy = MCCLStrategy(parallel_devices=[torch.device("cpu")], cluster_environment=LightningEnvironment(),
                            options=Options(spin_us="2K"), timeout=30)
    with pytest.raises(Exception, match=r"MCCL_SPIN_US='2K' is not a whole number"):
        strategy.setup_distributed()
    assert not torch.distributed.is_initialized()


def test_wire_type_travels_in_the_groups_options_not_the_environment(no_launch_env):
    """compress='bf16' makes a group that read bf16 (the engine's own wire_dtype says so) and leaves
    MCCL_WIRE_DTYPE unset; a fit that would reuse that group with another compress, or with compress unset, is a
    ValueError naming the group's setting; after destroy_process_group() the next group reads its own."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    from lightning_mccl import backend as _backend
    from lightning_mccl.launcher import free_port
    from lightning_mccl.lightning import MCCLStrategy

    def setup(compress):
        no_launch_env.setenv("MASTER_PORT", str(free_port()))
        MCCLStrategy(parallel_devices=[torch.device("cpu")], cluster_environment=LightningEnvironment(),
                     compress=compress, timeout=30).setup_distributed()

    no_launch_env.delenv("MCCL_WIRE_DTYPE", raising=False)
    try:
        setup("bf16")
        assert _backend.wire_dtype_of() == "bf16" and "MCCL_WIRE_DTYPE" not in os.environ
        setup("bf16")  # the same setting: the group is reused
        with pytest.raises(ValueError, match=r"existing default process group, which this fit reuses, was made "
                                             r"with MCCL_WIRE_DTYPE=bf16"):
            setup("fp16")
        with pytest.raises(ValueError, match=r"compress=None\): the existing default process group, which this fit "
                                             r"reuses, was made with MCCL_WIRE_DTYPE=bf16"):
            setup(None)  # would otherwise train compressed
        assert _backend.mccl_backend().wire_dtype == "bf16"
        torch.distributed.destroy_process_group()
        assert _backend.wire_dtype_of() is None
        setup("fp16")
        assert _backend.wire_dtype_of() == "fp16" and "MCCL_WIRE_DTYPE" not in os.environ
        torch.distributed.destroy_process_group()
        setup(None)
        assert _backend.wire_dtype_of() == "off"
        setup(None)  # compress unset again, the environment still unset: the group is reused
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_an_existing_default_group_of_another_backend_is_refused(no_launch_env):
    """A default group that already exists is reused by Lightning as it is: one over Gloo is a ValueError naming
    its backend, never a fit that silently runs on Gloo (the Trainer's strategy and Fabric's)."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    from lightning_mccl.lightning import MCCLFabricStrategy, MCCLStrategy

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        strategy = MCCLStrategy(parallel_devices=[torch.device("cpu")], cluster_environment=LightningEnvironment(),
                                timeout=30)
        with pytest.raises(ValueError) as info:
            strategy.setup_distributed()
        assert str(info.value) == ("MCCLStrategy: the default process group that already exists runs 'gloo', not "
                                   "mccl: destroy it first (torch.distributed.destroy_process_group()) or use "
                                   "process_group_backend='gloo'")
        fabric = MCCLFabricStrategy(parallel_devices=[torch.device("cpu")], cluster_environment=LightningEnvironment(),
                                    timeout=30)
        with pytest.raises(ValueError, match=r"^MCCLFabricStrategy: the default process group that already exists "
                                             r"runs 'gloo', not mccl"):
            fabric._setup_distributed()
        assert torch.distributed.get_backend() == "gloo"  # left as it was
    finally:
        torch.distributed.destroy_process_group()
