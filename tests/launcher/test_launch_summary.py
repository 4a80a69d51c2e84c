"""`mccl launch` prints rank 0's fit summary (the straggler table and communication line) after every rank
has ended, and takes its machine-readable line out of the ranks' output."""
from __future__ import annotations

import json
import sys

from cli_runner import HERE, run_mccl

from lightning_mccl.launcher.fleet_summary import MARKER, SummaryTap

PROGRAM = str(HERE / "summary_program.py")


def test_launch_prints_the_fleet_summary_at_the_end():
    result = run_mccl("launch", "--local", "2", "--", sys.executable, PROGRAM)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert MARKER not in result.stdout
    assert sum("trained" in line for line in out) == 2
    start = out.index("fleet summary (rank 0's CommMetrics):")
    assert all("trained" not in line for line in out[start:]), "the summary came before a rank's output"
    assert out[start + 1].split() == ["host", "ranks", "compute/step", "wait/step", "samples/s"]
    assert out[start + 3].split() == ["mac-b", "1", "300.0", "ms", "0.0", "ms", "40.0"]
    assert out[start + 4] == ("mccl: communication 25% of step time (10% exposed), goodput 3.50 Gb/s, 2.50 MB/step"
                              " per rank, 2 ranks; slowest: rank 1 on mac-b (1.33x the median compute)")
    assert out[start + 5].startswith("mccl: mode: DiLoCo, H = 4, tau = 1, plain averaging, pseudo-gradients in bf16: "
                                     "measured on the project's benchmark task")
    assert out[start + 5].endswith("(3 seeds; benchmarks/record/diloco.md#what-diloco-costs-in-accuracy)")


class Lines:
    def __init__(self):
        self.lines = []

    def line(self, spec, text):
        self.lines.append(text)

    def flush(self):
        pass


def test_tap_passes_other_lines_and_a_malformed_record_through():
    out = Lines()
    tap = SummaryTap(out)
    tap.line(None, "epoch 1")
    tap.line(None, f"{MARKER} not json")
    tap.line(None, f"{MARKER}x {{}}")
    assert out.lines == ["epoch 1", f"{MARKER} not json", f"{MARKER}x {{}}"] and tap.text() is None
    tap.line(None, f'{MARKER} {{"hosts": []}}')
    assert tap.text().startswith("fleet summary: unreadable")


def test_a_record_wrapped_by_a_live_progress_bar_is_put_together_again():
    """rich, redrawing a progress bar, wraps every printed line at the width and keeps the spaces at the ends of
    the pieces (an erase-line sequence before the first): the pieces joined are the record."""
    out = Lines()
    tap = SummaryTap(out)
    record = '{"metrics": {"bytes_per_step": 2500000.0}, "hosts": [{"host": "mac b", "ranks": [1]}], "world_size": 2}'
    line = f"{MARKER} {record}"
    cut1, cut2 = line.index(" ", 25) + 1, line.index(" ", 60) + 1  # after a space, as rich wraps
    pieces = ["\x1b[2K" + line[:cut1], line[cut1:cut2], line[cut2:]]
    tap.line(None, "epoch 1")
    for piece in pieces:
        tap.line(None, piece)
    tap.line(None, "after")
    assert out.lines == ["epoch 1", "after"] and tap.record == json.loads(record)
    tap.line(None, f"{MARKER} {{never closed")
    tap.line(None, "the rank's last line")
    tap.rank_exited(None, 0)  # never a record: shown as it came
    assert out.lines[2:] == [f"{MARKER} {{never closed", "the rank's last line"]
