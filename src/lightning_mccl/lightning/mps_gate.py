"""Lets mccl's strategy instances past the MPS check of Lightning's connectors, and nothing else.

The Trainer's `_AcceleratorConnector._check_config_and_set_final_flags` (and Fabric's
`_Connector._check_config_and_set_final_flags`, the same check) raises "strategies from the DDP family are not
supported on the MPS accelerator" for every `ParallelStrategy` instance (and every strategy name containing
"ddp") when MPS is available. That holds for Gloo, not for mccl. The registered names ("mccl", ...) pass as
they are; an instance (`strategy=MCCLStrategy(...)`, LightningCLI's `class_path`) cannot, since no override
of the strategy can change an isinstance check, and Lightning runs the check before the strategy is asked
anything.

So that one method of each connector is wrapped (checked at import, see `internals`): for an instance of
our strategy (`MCCLStrategy`, `MCCLFabricStrategy`) it runs Lightning's method unchanged, with the instance
seen through a view, a `Strategy` of that front end that is not a
`ParallelStrategy` and reads every attribute from the instance (the method copies its accelerator, precision,
checkpoint_io, cluster environment and devices into the connector); then the connector's strategy flag is the
instance again. Every other strategy gets Lightning's method untouched. No module global is rebound, so a
Trainer built at the same time on another thread sees Lightning as it is.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

from lightning.pytorch.strategies import Strategy

from .internals import LightningVersionError, checked, lightning_version

TRAINER = ("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector",
           ("self", "strategy", "accelerator", "precision", "plugins", "sync_batchnorm"))
FABRIC = ("lightning.fabric.connector", "_Connector", ("self", "strategy", "accelerator", "precision", "plugins"))


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


def install(strategy_class: type, connector: tuple = TRAINER, strategy_base: Optional[type] = None) -> None:
    """Wraps the connector's check once per process for instances of `strategy_class` (a subclass of
    `strategy_base`, by default the Trainer's Strategy)."""
    module, cls, params = connector
    check = checked(module, f"{cls}._check_config_and_set_final_flags", params)
    connector_class = getattr(__import__(module, fromlist=[cls]), cls)
    original = connector_class._check_config_and_set_final_flags
    if getattr(original, "_mccl_gate", False):
        return
    view_class = _view_class(strategy_base or Strategy)

    @functools.wraps(check)
    def _check_config_and_set_final_flags(self: Any, strategy: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(strategy, strategy_class):
            return original(self, strategy, *args, **kwargs)
        view = view_class(strategy)
        original(self, view, *args, **kwargs)
        if getattr(self, "_strategy_flag", None) is not view:
            raise LightningVersionError(f"{module}.{cls} no longer keeps the strategy in _strategy_flag "
                                        f"(Lightning {lightning_version()})")
        self._strategy_flag = strategy

    _check_config_and_set_final_flags._mccl_gate = True  # type: ignore[attr-defined]
    connector_class._check_config_and_set_final_flags = _check_config_and_set_final_flags
