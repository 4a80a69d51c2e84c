"""pytest setup for the torch.distributed tests: make the test modules importable by name
(the spawned rank processes import the test function by module name) and show the backend under test."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from lightning_mccl.testing import backend_name  # noqa: E402


def pytest_report_header(config):
    return f"torch.distributed backend under test: {backend_name()} (set MCCL_TEST_BACKEND to change)"
