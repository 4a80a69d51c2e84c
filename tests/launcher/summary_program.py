"""A rank program for test_launch_summary.py: rank 0 prints the end-of-fit summary record the way
CommMetrics does under `mccl launch` ("$MCCL_SUMMARY_MARKER <json>"), every rank prints one ordinary line."""
import json
import os

RECORD = {
    "metrics": {"time_per_step_s": 0.05, "step_time_s": 0.2, "exposed_fraction": 0.1, "wire_goodput_gbps": 3.5,
                "bytes_per_step": 2.5e6, "step_time_max_over_ranks_s": 0.21},
    "hosts": [{"host": "mac-a", "ranks": [0], "compute_s": 0.15, "wait_s": 0.05, "samples_per_s": 80.0},
              {"host": "mac-b", "ranks": [1], "compute_s": 0.3, "wait_s": 0.0, "samples_per_s": 40.0}],
    "slowest": {"rank": 1, "host": "mac-b", "compute_s": 0.3, "factor": 1.33},
    "world_size": 2,
    "mode": {"sync": "diloco", "compress": "bf16", "powersgd_rank": None, "sync_every": 4, "sync_delay": 1,
             "plain_averaging": True},
}

rank = int(os.environ["RANK"])
print(f"rank {rank} trained", flush=True)
marker = os.environ.get("MCCL_SUMMARY_MARKER")
if rank == 0 and marker:
    print(f"{marker} {json.dumps(RECORD)}", flush=True)
