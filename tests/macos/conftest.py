"""tests/macos: the same test bodies on MPS tensors (on a Mac, .github/workflows/macos.yml) and on CPU
tensors (everywhere). The rank processes import these modules by name, so this folder and tests/torch (the
harness) go on sys.path."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(os.path.dirname(HERE), "torch")):
    if path not in sys.path:
        sys.path.insert(0, path)
