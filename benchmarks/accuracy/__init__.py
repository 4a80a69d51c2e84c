"""The parts of benchmarks/convergence.py: the task, the methods, the ranks' training, the step times, the report."""
