"""Joiners that differ from the running job, on real processes (elastic_rank.py, 2 CPU members): one with another
model (8 inputs where the job's has 6) and one with another config (its learning rate). Each is refused before it
registers and exits with JoinRefused naming the difference; host 0's member says so; the members never see them:
every step commits with the two of them, and every epoch's ledger holds every sample id once."""
from __future__ import annotations

import socket

import pytest

from elastic_launch import Job
from elastic_rank import GLOBAL_BATCH, LR, MOMENTUM, SAMPLER_SEED
from lightning_mccl.elastic.fingerprint import config_hash
from test_churn import check_survivors

pytestmark = pytest.mark.slow
RUN_S = 60.0  # two members and two joiners import torch, the joiners are refused, the members finish
HOLD_AT = 2


def test_joiners_with_another_model_or_config_are_refused_and_the_members_finish_undisturbed(tmp_path):
    job = Job(tmp_path, 2, {"ELASTIC_HOLD_AT": str(HOLD_AT)})
    try:
        job.join("joiner-model", {"ELASTIC_MODEL_INPUTS": "8"})
        job.join("joiner-config", {"ELASTIC_LR": "0.1"})
        codes = job.wait(RUN_S, ["joiner-model", "joiner-config"])
        assert codes == {"joiner-model": 1, "joiner-config": 1}, job.outputs()
        model = "its model differs: 'model.weight' is float32[1, 8] here, float32[1, 6] in the job"
        assert f"JoinRefused: mccl elastic: this joiner cannot join the job: {model}\n" in job.output("joiner-model")
        config = {"momentum": MOMENTUM, "global_batch": GLOBAL_BATCH, "sampler_seed": SAMPLER_SEED}
        here, there = config_hash({**config, "lr": 0.1}), config_hash({**config, "lr": LR})
        config_differs = f"the config differs (hash {here[:12]} here, hash {there[:12]} in the job)"
        assert (f"JoinRefused: mccl elastic: this joiner cannot join the job: {config_differs}\n"
                in job.output("joiner-config")), job.output("joiner-config")
        job.await_file("holding", RUN_S)  # the members are still in the job, and were not disturbed
        (job.out / "go").write_text("1")
        assert job.wait(RUN_S, ["m0", "m1"]) == {"m0": 0, "m1": 0}, job.outputs()
    finally:
        job.kill_all()
    results = check_survivors(job, ["m0", "m1"])
    boundaries = results["m0"]["boundaries"]
    assert all(b["committed"] and b["members"] == ["m0", "m1"] for b in boundaries), boundaries
    host = job.output("m0")
    for name, why in (("joiner-model", model), ("joiner-config", config_differs)):
        line = f"mccl elastic: a joiner on {socket.gethostname()} (pid {job.procs[name].pid}) was refused: {why}\n"
        assert line in host, host[-3000:]
    assert "joined" not in host
