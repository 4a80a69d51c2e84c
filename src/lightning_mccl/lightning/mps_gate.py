"""Lets `MCCLStrategy` instances past the accelerator connector's MPS check, and nothing else.

`_AcceleratorConnector._check_config_and_set_final_flags` raises "strategies from the DDP family are not
supported on the MPS accelerator" for every `ParallelStrategy` instance (and every strategy name containing
"ddp") when MPS is available. That holds for Gloo, not for mccl. The registered names ("mccl", ...) pass as
they are; an instance (`strategy=MCCLStrategy(...)`, LightningCLI's `class_path`) cannot, since no override
of the strategy can change an isinstance check, and Lightning runs the check before the strategy is asked
anything.

So that one method is wrapped (checked at import, see `internals`): for an `MCCLStrategy` instance it runs
Lightning's method unchanged, with the instance seen through `_ConfigView`, a `Strategy` that is not a
`ParallelStrategy` and reads every attribute from the instance (the method copies its accelerator, precision,
checkpoint_io, cluster environment and devices into the connector); then the connector's strategy flag is the
instance again. Every other strategy gets Lightning's method untouched. No module global is rebound, so a
Trainer built at the same time on another thread sees Lightning as it is.
"""
from __future__ import annotations

import functools
from typing import Any

from lightning.pytorch.strategies import Strategy

from .internals import LightningVersionError, checked, lightning_version

CONNECTOR = "lightning.pytorch.trainer.connectors.accelerator_connector"
_CHECK = checked(CONNECTOR, "_AcceleratorConnector._check_config_and_set_final_flags",
                 ("self", "strategy", "accelerator", "precision", "plugins", "sync_batchnorm"))


class _ConfigView(Strategy):
    """A Strategy, not a ParallelStrategy, whose attributes are the wrapped strategy's."""

    def __init__(self, strategy: Strategy) -> None:  # noqa: D107 - no Strategy.__init__: nothing of its own
        self.__dict__["_mccl_strategy"] = strategy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_mccl_strategy"], name)


_ConfigView.__abstractmethods__ = frozenset()  # never used as a strategy: only read during the check


def install(strategy_class: type) -> None:
    """Wraps the check once per process for instances of `strategy_class`."""
    cls = _CHECK.__qualname__.split(".")[0]
    connector = getattr(__import__(CONNECTOR, fromlist=[cls]), cls)
    original = connector._check_config_and_set_final_flags
    if getattr(original, "_mccl_gate", False):
        return

    @functools.wraps(original)
    def _check_config_and_set_final_flags(self: Any, strategy: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(strategy, strategy_class):
            return original(self, strategy, *args, **kwargs)
        view = _ConfigView(strategy)
        original(self, view, *args, **kwargs)
        if getattr(self, "_strategy_flag", None) is not view:
            raise LightningVersionError(f"{CONNECTOR}._AcceleratorConnector no longer keeps the strategy in "
                                        f"_strategy_flag (Lightning {lightning_version()})")
        self._strategy_flag = strategy

    _check_config_and_set_final_flags._mccl_gate = True  # type: ignore[attr-defined]
    connector._check_config_and_set_final_flags = _check_config_and_set_final_flags
