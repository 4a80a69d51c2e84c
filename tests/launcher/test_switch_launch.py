"""`mccl launch --switch` of the README's recipe command on 3 emulated hosts, with no extra settings: each
rank's Lightning makes a Gloo group of its own (the barrier around `prepare_data`), which must listen on
the host's switch interface (GLOO_SOCKET_IFNAME from the rank shim, `launcher/host_net.py`), not where the
machine's name resolves (loopback inside every namespace here). One epoch of 2 steps of a one-block ViT.
Needs root and network namespaces (the switch emulator), as tests/benchmarks/test_switch.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_mccl
from lightning_mccl.switch import SwitchFleet, privilege_problem, random_tag
from test_launch import prefixed

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = privilege_problem()
# The README's command, then what makes it tiny
RECIPE = ["python", str(ROOT / "examples" / "vit_finetune.py"), "fit", "--config",
          str(ROOT / "configs" / "vit_local.yaml"), "--trainer.devices", "1", "--trainer.num_nodes", "3", "--trainer.max_epochs", "1"]
TINY = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--model.model_kwargs",
        '{"depth": 1}', "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.callbacks",
        "null", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


@pytest.mark.slow  # a Lightning fit on 3 ranks: 12-22 s on 2 cores
@pytest.mark.skipif(PROBLEM is not None, reason=f"switch emulator unavailable: {PROBLEM}")
def test_the_readme_recipe_runs_on_a_3_host_switch_with_no_extra_settings(tmp_path):
    with SwitchFleet(3, "1gbit", tag=random_tag()) as fleet:
        r = run_mccl("launch", "--switch", fleet.tag, "--", *RECIPE, *TINY, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr
    out = prefixed(r.stdout)
    (final,) = [t for t in out["h0 r0"] if t.startswith("final val/acc")]
    assert "after 1 epochs on 3 rank(s) (MCCLStrategy" in final, final
    assert "all 3 ranks finished" in r.stderr and "Gloo" not in r.stdout, r.stdout[-3000:]
