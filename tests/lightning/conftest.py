"""pytest setup for the Lightning tests: this directory on sys.path (the tests import fit_script and
launch_env), a process without launcher variables, and an MPS stand-in made the way Lightning's own tests
make one."""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from launch_env import LAUNCH_VARS  # noqa: E402


@pytest.fixture
def no_launch_env(monkeypatch):
    """This process without launcher variables; whatever a test or Lightning sets is undone afterwards."""
    for name in LAUNCH_VARS:
        monkeypatch.setenv(name, "")  # records the original value, so that anything set later is undone too
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def mps_stand_in(no_launch_env):
    """MPS reported available with one device, as Lightning's tests do it (tests_pytorch/conftest.py,
    `mock_mps_count`): fabric's MPSAccelerator.is_available and _get_all_available_mps_gpus. torch itself still
    has no MPS here, so nothing may touch an MPS tensor. lightning_mccl then registers as it does on a Mac, where
    its MPS gate is installed too (registration.py); the connectors' checks are put back afterwards."""
    import lightning.fabric.accelerators.mps as fabric_mps

    from lightning_mccl import registration
    from lightning_mccl.lightning import mps_gate

    no_launch_env.setattr(fabric_mps, "_get_all_available_mps_gpus", lambda: [0])
    no_launch_env.setattr(fabric_mps.MPSAccelerator, "is_available", lambda *_: True)
    for connector in (mps_gate.TRAINER, mps_gate.FABRIC):
        owner, method = mps_gate.connector_method(connector)
        no_launch_env.setattr(owner, method, getattr(owner, method))  # restored when the test ends
    registration.register_lightning()
    return no_launch_env
