"""pytest setup for the benchmark tests: this directory (bench_runner) and benchmarks/ (its `sweep` package)
importable by name."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parents[1] / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
