"""The Lightning coupling: the internals lightning-mccl uses are checked at import, and the MPS gate changes
nothing that another Trainer (on another thread) could see.

- A Lightning whose `_init_dist_connection`, connector check or overridden DDPStrategy private has another
  shape or is gone (here: a fake, patched in a child process before the strategy modules are imported) makes
  the import (an override) or the making of the strategy (a function called) fail with LightningVersionError
  naming the Lightning version and the tested ones.
- While an MCCLStrategy instance passes the connector on the MPS stand-in, another thread's DDPStrategy
  Trainer is still refused, and no module global of Lightning's was rebound.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading

import pytest

from launch_env import clean_env

# One child process tries every fake shape in turn (importing Lightning once): each case patches Lightning,
# imports the strategy modules afresh (every lightning_mccl.lightning module dropped first, so that each
# check runs again) and makes each strategy (the functions called are checked then), prints what that raised
# as one JSON line, and puts Lightning back.
FAKE_SHAPES = textwrap.dedent("""
    import json, sys
    import lightning, lightning.fabric.utilities.distributed as d
    from lightning.fabric.strategies import ddp as fabric_ddp
    from lightning.pytorch.strategies import ddp as trainer_ddp
    from lightning.pytorch.trainer.connectors import accelerator_connector as c
    lightning.__version__ = "9.9.9"
    connector = c._AcceleratorConnector

    def _init_dist_connection(env, backend_name_changed, rank=None):
        pass

    def _check_config_and_set_final_flags(self, strategy, accelerator, precision, plugins):
        pass

    def _register_ddp_hooks(self, model):
        pass

    def _determine_ddp_device_ids(self, index):
        pass

    # change: (owner, name, the fake put there; None: the name removed)
    CHANGES = {
        "init": (d, "_init_dist_connection", _init_dist_connection),
        "connector": (connector, "_check_config_and_set_final_flags", _check_config_and_set_final_flags),
        "gone": (connector, "_check_config_and_set_final_flags", None),
        "hooks": (trainer_ddp.DDPStrategy, "_register_ddp_hooks", _register_ddp_hooks),
        "fabric_setup": (fabric_ddp.DDPStrategy, "_setup_distributed", None),
        "fabric_ranks": (fabric_ddp.DDPStrategy, "_set_world_ranks", None),
        "fabric_device_ids": (fabric_ddp.DDPStrategy, "_determine_ddp_device_ids", _determine_ddp_device_ids),
    }
    for change in sys.argv[1:]:
        for name in [m for m in sys.modules if m == "lightning_mccl.lightning" or m.startswith("lightning_mccl.lightning.")]:
            del sys.modules[name]
        owner, name, fake = CHANGES[change]
        saved = vars(owner)[name]
        if fake is None:
            delattr(owner, name)
        else:
            setattr(owner, name, fake)
        try:
            import lightning_mccl.lightning.strategy, lightning_mccl.lightning.fabric
            lightning_mccl.lightning.strategy.MCCLStrategy()
            lightning_mccl.lightning.fabric.MCCLFabricStrategy()
            raised = None
        except ImportError as e:
            raised = f"{type(e).__name__} {e}"
        print(json.dumps({change: raised}), flush=True)
        setattr(owner, name, saved)
""")
SHAPES = [
    ("init", "lightning.fabric.utilities.distributed._init_dist_connection",
     "has parameters (env, backend_name_changed, rank), expected (cluster_environment, torch_distributed_backend, ...)"),
    ("connector", "_AcceleratorConnector._check_config_and_set_final_flags",
     "has parameters (self, strategy, accelerator, precision, plugins), expected (self, strategy, accelerator, "
     "precision, plugins, sync_batchnorm, ...)"),
    ("gone", "_AcceleratorConnector._check_config_and_set_final_flags", "does not exist"),
    ("hooks", "lightning.pytorch.strategies.ddp.DDPStrategy._register_ddp_hooks",
     "has parameters (self, model), expected (self, ...)"),
    ("fabric_setup", "lightning.fabric.strategies.ddp.DDPStrategy._setup_distributed", "does not exist"),
    ("fabric_ranks", "lightning.fabric.strategies.ddp.DDPStrategy._set_world_ranks", "does not exist"),
    ("fabric_device_ids", "lightning.fabric.strategies.ddp.DDPStrategy._determine_ddp_device_ids",
     "has parameters (self, index), expected (self, ...)"),
]


@pytest.fixture(scope="module")
def shape_errors() -> dict:
    """{change: what importing the strategy raised with that fake shape}, from one child process."""
    changes = [change for change, _, _ in SHAPES]
    proc = subprocess.run([sys.executable, "-c", FAKE_SHAPES, *changes], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    errors = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            errors.update(json.loads(line))
    assert list(errors) == changes, proc.stdout + proc.stderr
    return errors


@pytest.mark.parametrize("change,names,problem", SHAPES)
def test_an_unexpected_lightning_shape_fails_the_strategy_naming_the_version(shape_errors, change, names, problem):
    from lightning_mccl.lightning.internals import TESTED_LIGHTNING

    out = shape_errors[change]
    assert out is not None, f"{change}: importing or making the strategy did not fail"
    assert out.startswith("LightningVersionError lightning-mccl cannot use Lightning 9.9.9: "), out
    assert names in out and problem in out, out
    assert f"tested with Lightning {TESTED_LIGHTNING[0]} to {TESTED_LIGHTNING[-1]}" in out, out


def test_the_installed_lightning_passes_the_checks():
    from lightning.fabric.utilities import distributed

    from lightning_mccl.lightning import internals

    internals.check_lightning()
    assert internals.checked(*internals.INIT_DIST) is distributed._init_dist_connection


def test_the_mps_gate_rebinds_nothing_and_other_threads_are_still_refused(mps_stand_in, tmp_path):
    """Another thread builds a Trainer with Lightning's DDP on MPS while ours is inside the connector's check
    (paused in a function that check calls after its MPS test): it must still be refused."""
    import lightning as L
    from lightning.pytorch.accelerators import MPSAccelerator
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.trainer.connectors import accelerator_connector

    from lightning_mccl.lightning import MCCLStrategy

    inside, refused, errors = threading.Event(), [], []

    def other_trainer():
        inside.wait(30)
        try:
            L.Trainer(strategy=DDPStrategy(), accelerator="mps", devices=1, logger=False,
                      default_root_dir=str(tmp_path))
        except ValueError as e:
            refused.append("not supported on the MPS accelerator" in str(e))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    thread = threading.Thread(target=other_trainer)
    convert = accelerator_connector._convert_precision_to_unified_args

    def convert_while_the_other_thread_runs(precision):
        if threading.current_thread() is not thread and not inside.is_set():
            inside.set()
            thread.join(30)  # the other Trainer runs its whole check while ours is inside its own
        return convert(precision)

    mps_stand_in.setattr(accelerator_connector, "_convert_precision_to_unified_args",
                         convert_while_the_other_thread_runs)
    before = dict(vars(accelerator_connector))
    thread.start()
    trainer = L.Trainer(strategy=MCCLStrategy(), accelerator="mps", devices=1, logger=False,
                        default_root_dir=str(tmp_path))
    thread.join(30)
    assert inside.is_set(), "the connector's check did not call _convert_precision_to_unified_args"
    assert not errors, errors
    assert refused == [True], "Lightning's DDP on another thread was not refused while ours was in the check"
    assert type(trainer.strategy) is MCCLStrategy and isinstance(trainer.accelerator, MPSAccelerator)
    assert {k: v for k, v in vars(accelerator_connector).items() if before.get(k) is not v} == {}


def test_the_tested_versions_are_declared_once_and_agree():
    """pyproject.toml declares them; internals.py names them in errors; the Makefile tests the oldest; the
    optional dependency's floor is the oldest."""
    from pathlib import Path

    from lightning_mccl.lightning.internals import TESTED_LIGHTNING

    root = Path(__file__).resolve().parents[2]
    pyproject = (root / "pyproject.toml").read_text()
    declared = re.search(r'^tested-lightning = \[(.*)\]$', pyproject, re.M).group(1)
    assert tuple(v.strip(' "') for v in declared.split(",")) == TESTED_LIGHTNING
    oldest = TESTED_LIGHTNING[0]
    assert re.search(rf'^LIGHTNING_OLDEST \?= {re.escape(oldest)}$', (root / "Makefile").read_text(), re.M)
    assert f'"lightning>={oldest}"' in pyproject
