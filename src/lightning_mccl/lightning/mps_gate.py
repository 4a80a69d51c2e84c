"""Lets mccl's strategy instances past the MPS check of Lightning's connectors, and nothing else (registration.py
installs it, on machines where Lightning's MPS accelerator is available).

The Trainer's `_AcceleratorConnector._check_config_and_set_final_flags` (and Fabric's
`_Connector._check_config_and_set_final_flags`, the same check) raises "strategies from the DDP family are not
supported on the MPS accelerator" for every `ParallelStrategy` instance (and every strategy name containing
"ddp") when MPS is available. That holds for Gloo, not for mccl. The registered names ("mccl", ...) pass as
they are; an instance (`strategy=MCCLStrategy(...)`, LightningCLI's `class_path`) cannot, since no override
of the strategy can change an isinstance check, and Lightning runs the check before the strategy is asked
anything.

So that one method of each connector is wrapped (its shape checked, see `internals`): for an instance of one
of our strategies (a class with `runs_on_mps = True`: `MCCLStrategy`, `MCCLDiLoCoStrategy`, `MCCLFabricStrategy`)
it runs Lightning's method unchanged, with the instance
seen through a view, a `Strategy` of that front end that is not a
`ParallelStrategy` and reads every attribute from the instance (the method copies its accelerator, precision,
checkpoint_io, cluster environment and devices into the connector); then the connector's strategy flag is the
instance again. Every other strategy gets Lightning's method untouched. No module global is rebound, so a
Trainer built at the same time on another thread sees Lightning as it is.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Tuple

from .internals import CONNECTOR_CHECKS, LightningVersionError, checked, lightning_version

# (the connector's check as internals.py checks it, the module of the front end's Strategy)
TRAINER = (CONNECTOR_CHECKS[0], "lightning.pytorch.strategies")
FABRIC = (CONNECTOR_CHECKS[1], "lightning.fabric.strategies")
MARK = "_mccl_gate"  # set on the wrapper, so that it wraps once
STRATEGY_MARK = "runs_on_mps"  # the class attribute of the strategies the gate lets through


def mps_available() -> bool:
    """Whether Lightning's MPS accelerator is available here (only then does its connector refuse our instances)."""
    from lightning.fabric.accelerators import MPSAccelerator

    return MPSAccelerator.is_available()


def connector_method(connector: tuple) -> Tuple[type, str]:
    """The connector class whose check the gate wraps, and the method's name; LightningVersionError when its shape
    is not the one this code was tested with."""
    (module, qualname, params), _ = connector
    checked(module, qualname, params)
    cls, method = qualname.split(".")
    return getattr(importlib.import_module(module), cls), method


def _view_class(base: type) -> type:
    """A `base` (Strategy of the Trainer or of Fabric), not a ParallelStrategy, whose attributes are the
    wrapped strategy's."""

    class _ConfigView(base):  # type: ignore[misc, valid-type]
        def __init__(self, strategy: Any) -> None:  # noqa: D107 - no base __init__: nothing of its own
            self.__dict__["_mccl_strategy"] = strategy

        def __getattr__(self, name: str) -> Any:
            return getattr(self.__dict__["_mccl_strategy"], name)

    _ConfigView.__abstractmethods__ = frozenset()  # never used as a strategy: only read during the check
    return _ConfigView


def gated(original: Callable, connector: tuple) -> Callable:
    """`original` (the connector's check) wrapped: our strategy instances pass through a view, others go as they
    are."""
    (module, qualname, _), strategies = connector
    view_class = _view_class(importlib.import_module(strategies).Strategy)

    @functools.wraps(original)
    def _check_config_and_set_final_flags(self: Any, strategy: Any, *args: Any, **kwargs: Any) -> None:
        if not getattr(type(strategy), STRATEGY_MARK, False):
            return original(self, strategy, *args, **kwargs)
        view = view_class(strategy)
        original(self, view, *args, **kwargs)
        if getattr(self, "_strategy_flag", None) is not view:
            raise LightningVersionError(f"{module}.{qualname.split('.')[0]} no longer keeps the strategy in _strategy_flag "
                                        f"(Lightning {lightning_version()})")
        self._strategy_flag = strategy

    setattr(_check_config_and_set_final_flags, MARK, True)
    return _check_config_and_set_final_flags
