"""The MPS gate of Lightning's connectors, opened for one strategy class.

Both the Trainer's `_AcceleratorConnector` and Fabric's `_Connector` refuse every `ParallelStrategy` instance
together with an MPS accelerator in `_check_config_and_set_final_flags` ("strategies from the DDP family are
not supported on the MPS accelerator"), which is true of Gloo, not of mccl; no override of a strategy can
change an isinstance check. `open_mps_gate` wraps that method so that for an instance of `strategy_cls`, and
only for one, it runs with the connector module's `MPSAccelerator` reporting no MPS (the one thing the method
reads MPS availability for); the name is put back before the call returns. Every other strategy goes
through Lightning's method untouched. Checked at call time: a Lightning without these names fails clearly.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any


def open_mps_gate(connector_module: ModuleType, connector_cls: type, strategy_cls: type) -> None:
    """Idempotent; see the module docstring."""
    original = getattr(connector_cls, "_check_config_and_set_final_flags", None)
    accelerator = getattr(connector_module, "MPSAccelerator", None)
    if original is None or accelerator is None:
        raise ImportError(f"lightning-mccl: {connector_module.__name__} has no MPSAccelerator or"
                          f" {connector_cls.__name__}._check_config_and_set_final_flags; this Lightning version's MPS"
                          " gate cannot be opened for mccl")
    if getattr(original, "_mccl_gate", False):
        return

    class _GateOpen(accelerator):
        @staticmethod
        def is_available() -> bool:
            return False

    @functools.wraps(original)
    def _check_config_and_set_final_flags(self: Any, *args: Any, **kwargs: Any) -> None:
        strategy = kwargs["strategy"] if "strategy" in kwargs else (args[0] if args else None)
        if not isinstance(strategy, strategy_cls):
            return original(self, *args, **kwargs)
        gate = connector_module.MPSAccelerator
        connector_module.MPSAccelerator = _GateOpen
        try:
            return original(self, *args, **kwargs)
        finally:
            connector_module.MPSAccelerator = gate

    _check_config_and_set_final_flags._mccl_gate = True  # type: ignore[attr-defined]
    connector_cls._check_config_and_set_final_flags = _check_config_and_set_final_flags
