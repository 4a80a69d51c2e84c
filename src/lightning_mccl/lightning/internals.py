"""The Lightning internals lightning-mccl still uses, each checked at import.

Everything else goes through Lightning's public strategy methods. These have no public equivalent:

- `lightning.fabric.utilities.distributed._init_dist_connection`: how `DDPStrategy.setup_distributed`
  brings up the default group (MASTER_ADDR/PORT from the cluster environment); `MCCLStrategy` and
  `MCCLFabricStrategy` call it without ``device_id`` (see `MCCLStrategy.setup_distributed`).
- `_AcceleratorConnector._check_config_and_set_final_flags` (Trainer's and Fabric's): refuses every
  ParallelStrategy instance on MPS (see `mps_gate`).
- The DDPStrategy methods the strategies override (`checked_override`): the Trainer's
  `_register_ddp_hooks` and `_setup_model`; Fabric's `_setup_distributed`, `_set_world_ranks` and
  `_determine_ddp_device_ids`.
- The Trainer's `_checkpoint_connector` (`CHECKPOINT_STEPS`): the elastic strategy takes the training state
  with it to send a joiner, and loads the state received there, as a resumed fit loads a checkpoint.

Each is looked up by name and its parameters are compared with the ones this code calls it with (an
override's: its own). When a Lightning release renames or reshapes one, making a strategy (`check_lightning`)
or importing it (an override, `checked_override`) fails with `LightningVersionError` naming the Lightning
version and the tested ones, instead of misbehaving later (an override of a renamed method would silently
never be called).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Sequence

# The Lightning releases the test suite runs against (CI: `make test-lightning-oldest` and the current one).
TESTED_LIGHTNING = ("2.5.2", "2.6.6")


class LightningVersionError(ImportError):
    """This Lightning's internals differ from the ones lightning-mccl was tested with."""


def lightning_version() -> str:
    try:
        import lightning

        return str(lightning.__version__)
    except Exception:  # noqa: BLE001 - only for the message
        return "unknown"


def _fail(what: str, problem: str) -> LightningVersionError:
    return LightningVersionError(
        f"lightning-mccl cannot use Lightning {lightning_version()}: {what} {problem}. lightning-mccl is tested "
        f"with Lightning {TESTED_LIGHTNING[0]} to {TESTED_LIGHTNING[-1]}: install one of those "
        f"(pip install 'lightning>={TESTED_LIGHTNING[0]},<={TESTED_LIGHTNING[-1]}'), or a lightning-mccl that "
        f"supports this Lightning")


def checked(module: str, qualname: str, params: Sequence[str]) -> Any:
    """`module`'s `qualname` (a function, or Class.method), after checking that its first parameters are
    `params`, in that order (more may follow if they have defaults or are *args/**kwargs)."""
    what = f"{module}.{qualname}"
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise _fail(what, "does not exist") from None
    try:
        found = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        raise _fail(what, "has no inspectable signature") from None
    names = [p.name for p in found]
    extra = found[len(params):]
    required_extra = [p.name for p in extra if p.default is inspect.Parameter.empty
                      and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if names[:len(params)] != list(params) or required_extra:
        raise _fail(what, f"has parameters ({', '.join(names)}), expected ({', '.join(params)}, ...)")
    return obj


# The private functions called (not overridden), with the first parameters this code relies on.
INIT_DIST = ("lightning.fabric.utilities.distributed", "_init_dist_connection",
             ("cluster_environment", "torch_distributed_backend"))
CONNECTOR_CHECKS = (
    ("lightning.pytorch.trainer.connectors.accelerator_connector",
     "_AcceleratorConnector._check_config_and_set_final_flags",
     ("self", "strategy", "accelerator", "precision", "plugins", "sync_batchnorm")),
    ("lightning.fabric.connector", "_Connector._check_config_and_set_final_flags",
     ("self", "strategy", "accelerator", "precision", "plugins")),
)


# The checkpoint connector's methods the elastic strategy calls, in the order a resumed fit calls them.
CHECKPOINT_CONNECTOR = "lightning.pytorch.trainer.connectors.checkpoint_connector"
CHECKPOINT_STEPS = (("_CheckpointConnector.dump_checkpoint", ("self", "weights_only")),
                    ("_CheckpointConnector.restore_model", ("self",)),
                    ("_CheckpointConnector.restore_datamodule", ("self",)),
                    ("_CheckpointConnector.restore_callbacks", ("self",)),
                    ("_CheckpointConnector.restore_training_state", ("self",)))


def check_checkpoint_connector() -> None:
    """LightningVersionError unless the checkpoint connector has the methods the elastic strategy calls."""
    for qualname, params in CHECKPOINT_STEPS:
        checked(CHECKPOINT_CONNECTOR, qualname, params)


def check_lightning() -> None:
    """LightningVersionError unless the private functions this package calls (`_init_dist_connection`) or wraps
    (the connectors' MPS check, mps_gate.py) have the shapes it was tested with; the strategies call it when
    they are made, so that a new Lightning fails at once, naming itself, and never half-way through a fit."""
    for module, qualname, params in (INIT_DIST, *CONNECTOR_CHECKS):
        checked(module, qualname, params)


def checked_override(module: str, qualname: str) -> Callable[[Callable], Callable]:
    """Decorator for a method that overrides Lightning's private `module`.`qualname`: checks (with `checked`)
    that it exists and takes the override's parameters; returns the method unchanged."""
    def check(method: Callable) -> Callable:
        checked(module, qualname, list(inspect.signature(method).parameters))
        return method
    return check
