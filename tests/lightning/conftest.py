"""pytest setup for the Lightning tests: this directory on sys.path (the tests import fit_script and
launch_env), a process without launcher variables, and the MPS stand-in (tests/conftest.py) in one."""
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
def mps_stand_in(no_launch_env, mps_stand_in):
    """The MPS stand-in (tests/conftest.py) in a process without launcher variables."""
    return no_launch_env
