"""The launcher names a cause that a rank's output states anywhere (known_causes): macOS's GPU watchdog
("Impacting Interactivity", as torch's MPS and MLX print it, and the code torch printed as "Internal Error"
before macOS named it) with both fixes and what each costs, and a host that ssh lost mid-run. Canned lines
first, then `mccl launch` with a rank that prints the watchdog error and exits non-zero (the text is the
published one: no Mac ran it here)."""
from __future__ import annotations

import sys

from cli_runner import run_mccl
from lightning_mccl.launcher import RankSpec
from lightning_mccl.launcher.error_line import RankTails
from lightning_mccl.launcher.job import failure_line
from lightning_mccl.launcher.known_causes import GPU_WATCHDOG, HOST_LOST, known_cause
from lightning_mccl.launcher.supervisor import Outcome, RankExit

# torch's MPS (MPSStream) on a command buffer the watchdog stopped, as users reported it
MPS_ERROR = """Error: command buffer exited with error status.
\tThe Metal Performance Shaders operations encoded on it may not have completed.
\tError: 
\t(null)
\tImpacting Interactivity (0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)
\t<AGXG15XFamilyCommandBuffer: 0x35bc5d8a0>
    label = <none> """
MLX_ERROR = ("libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer "
             "execution failed: Impacting Interactivity (0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)")
OLD_TORCH = "\tInternal Error (0000000e:Internal Error)"
WATCHDOG_FIXES = ("let the display sleep while it trains (`pmset displaysleepnow`, or run headless over ssh): "
                  "reliable, and it costs only the screen; or `mccl launch --env AGX_RELAX_CDM_CTXSTORE_TIMEOUT=1` "
                  "relaxes the GPU watchdog on most Macs, at a cost to the responsiveness of the Mac's own screen")


def test_each_form_of_the_watchdog_error_is_recognised_and_others_are_not():
    for line in (*MPS_ERROR.splitlines()[4:5], MLX_ERROR, OLD_TORCH):
        assert known_cause(line) is GPU_WATCHDOG, line
    assert known_cause("Connection to studio-03 closed by remote host.") is HOST_LOST
    for line in ("Error: command buffer exited with error status.", "RuntimeError: CUDA out of memory",
                 "MCCL connection error: rank 1 lost its connection to rank 0"):
        assert known_cause(line) is None, line


def test_the_failed_ranks_summary_names_the_watchdog_seen_on_any_rank():
    specs = [RankSpec(r, f"studio-0{r + 1}", ()) for r in range(3)]
    tails = RankTails(output=type("Sink", (), {"line": lambda self, spec, text: None})())
    for text in ["epoch 3", *MPS_ERROR.splitlines(), "step 120 loss 0.41"]:
        tails.line(specs[2], text)
    tails.line(specs[0], "MCCL heartbeat timeout: rank 0 heard nothing from rank 2 (10.0.0.13:29601) for 30.1 s")
    failed = RankExit(specs[0], 1, False)
    outcome = Outcome(1, "failed", (failed,), failed)
    line = failure_line(outcome, tails)
    assert line.startswith("; its last line: MCCL heartbeat timeout: rank 0 heard nothing from rank 2"), line
    assert line.endswith(". The cause: macOS's GPU watchdog stopped the GPU work of the rank on studio-03 (\"Impacting "
                         "Interactivity\": on macOS 26 it kills sustained GPU work while a display is awake). Fix on "
                         f"studio-03: {WATCHDOG_FIXES} (not on every Mac: keep the display asleep too). `mccl doctor` "
                         "checks every Mac's display"), line


RANK = f"""
import os, sys, time
if os.environ["RANK"] == "1":
    sys.stderr.write({MPS_ERROR!r} + "\\n")
    print("loss is nan at step 57", flush=True)
    sys.exit(1)
time.sleep(60)
"""


def test_a_rank_printing_the_watchdog_error_gets_the_named_summary(tmp_path):
    r = run_mccl("launch", "--local", "2", "--", sys.executable, "-c", RANK, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("mccl: failed: rank 1 on local exited with code 1; its last line: loss is nan at step 57. "
                           "The cause: macOS's GPU watchdog stopped the GPU work of the rank on local"), last
    assert WATCHDOG_FIXES in last, last
