"""The churn benchmark's parts (benchmarks/churn.py): one member's training loop (member.py), the job of
member processes it starts, stops and restarts (job.py), and what its cases measure from their records
(measure.py)."""
