"""pytest setup for the elastic tests: this directory on sys.path (the rank program and its launcher)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
