"""The devices the tests in this folder run on: the CPU always, MPS where torch has it."""
import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param("mps", marks=pytest.mark.skipif(not torch.backends.mps.is_available(),
                                                 reason="needs Apple silicon with MPS (runs in .github/workflows/macos.yml)")),
]
