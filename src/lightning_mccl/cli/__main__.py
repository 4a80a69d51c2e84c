"""`python -m lightning_mccl.cli ...` is the `mccl` command."""
import sys

from . import main

sys.exit(main())
