"""pytest setup for the reliability smoke tests: benchmarks/ on sys.path (see reliability_env; the module has
its own name because every test directory's conftest is "conftest" when the whole suite runs)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import reliability_env  # noqa: E402,F401  (puts benchmarks/ on sys.path)
