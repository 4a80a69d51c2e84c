"""pytest setup for the elastic tests: this directory on sys.path (the rank programs and their launcher), and
tests/launcher (the `mccl launch --elastic` job of the Lightning tests)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(os.path.dirname(HERE), "launcher")):
    if path not in sys.path:
        sys.path.insert(0, path)
