"""tests/macos: the same test bodies on MPS tensors (on a Mac, .github/workflows/macos.yml) and on CPU
tensors (everywhere). The rank processes (lightning_mccl.testing) import these modules by name, so this
folder goes on sys.path."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
