"""pytest setup shared by every test directory: an MPS stand-in made the way Lightning's own tests make one."""
from __future__ import annotations

import pytest


@pytest.fixture
def mps_stand_in(monkeypatch):
    """MPS reported available with one device, as Lightning's tests do it (tests_pytorch/conftest.py,
    `mock_mps_count`): fabric's MPSAccelerator.is_available and _get_all_available_mps_gpus. torch itself still
    has no MPS here, so nothing may touch an MPS tensor. lightning_mccl then registers as it does on a Mac, where
    its MPS gate is installed too (registration.py); the connectors' checks are put back afterwards."""
    import lightning.fabric.accelerators.mps as fabric_mps

    from lightning_mccl import registration
    from lightning_mccl.lightning import mps_gate

    monkeypatch.setattr(fabric_mps, "_get_all_available_mps_gpus", lambda: [0])
    monkeypatch.setattr(fabric_mps.MPSAccelerator, "is_available", lambda *_: True)
    for connector in (mps_gate.TRAINER, mps_gate.FABRIC):
        owner, method = mps_gate.connector_method(connector)
        monkeypatch.setattr(owner, method, getattr(owner, method))  # restored when the test ends
    registration.register_lightning()
    return monkeypatch
