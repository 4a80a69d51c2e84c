"""What a joiner must share with the job (fingerprint.py): the same fingerprint admits it; another package or torch
version, a tensor of another shape or dtype, a tensor missing or extra, another config are each refused with a
message naming the difference. The comparison over a real TCPStore: host 0 publishes, a joiner that differs is
refused and logged, one that finds no job says so. A joiner that cannot reach the Store names the address, the
timeout and the likely causes."""
from __future__ import annotations

import dataclasses
import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import lightning_mccl
from elastic_launch import free_port
from lightning_mccl.elastic import (ElasticError, ElasticManager, ElasticSampler, ElasticSettings, JoinRefused,
                                    fingerprint)
from lightning_mccl.elastic.board import Board
from lightning_mccl.elastic.fingerprint import Fingerprint, config_hash, differences, refusal
from lightning_mccl.elastic.membership import Membership

CONFIG = {"lr": 0.05, "model": {"width": 64}}


class Net(torch.nn.Module):
    def __init__(self, width=64, out=10, dtype=torch.float32, head=False):
        super().__init__()
        self.fc = torch.nn.Linear(width, out, dtype=dtype)
        self.norm = torch.nn.BatchNorm1d(out)
        if head:
            self.head = torch.nn.Linear(out, 2)

    def forward(self, x):
        return self.norm(self.fc(x))


def job_state(**net):
    model = Net(**net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}


def fp(config=CONFIG, **net) -> Fingerprint:
    return fingerprint.of(job_state(**net)[2], config)


def test_the_signature_walks_the_nested_state_and_leaves_out_the_optimizers_lazy_state():
    model, optimizer, state = job_state()
    before = fingerprint.of(state, CONFIG)
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()  # creates the momentum buffers: a joiner that has not trained lacks them
    after = fingerprint.of(state, CONFIG)
    assert after == before
    assert before.model == (("model.fc.weight", "float32[10, 64]"), ("model.fc.bias", "float32[10]"),
                            ("model.norm.weight", "float32[10]"), ("model.norm.bias", "float32[10]"),
                            ("model.norm.running_mean", "float32[10]"), ("model.norm.running_var", "float32[10]"),
                            ("model.norm.num_batches_tracked", "int64[]"))
    assert before.package == lightning_mccl.__version__ and before.torch == torch.__version__
    assert len(before.model_digest) == 64 and differences(before, after) == []
    assert Fingerprint.from_json(before.to_json()) == before
    assert [name for name, _ in fingerprint.tensors({"a": [torch.zeros(1), (torch.zeros(2),)], "b": "text"})] == [
        "a.0", "a.1.0"]


def test_the_same_model_in_another_order_matches():
    job = fp()
    assert differences(dataclasses.replace(job, model=tuple(reversed(job.model))), job) == []


def test_a_tensor_of_another_shape_is_named():
    assert differences(fp(width=32), fp()) == [
        "its model differs: 'model.fc.weight' is float32[10, 32] here, float32[10, 64] in the job"]


def test_a_tensor_of_another_dtype_is_named():
    assert differences(fp(dtype=torch.float64), fp()) == [
        "its model differs: 'model.fc.weight' is float64[10, 64] here, float32[10, 64] in the job",
        "'model.fc.bias' is float64[10] here, float32[10] in the job"]


def test_a_tensor_missing_or_extra_is_named():
    assert differences(fp(head=True), fp()) == [
        "its model differs: 'model.head.weight' (float32[2, 10]) is here, not in the job's model",
        "'model.head.bias' (float32[2]) is here, not in the job's model"]
    assert differences(fp(), fp(head=True)) == [
        "its model differs: 'model.head.weight' (float32[2, 10]) is in the job's model, not here",
        "'model.head.bias' (float32[2]) is in the job's model, not here"]


def test_another_package_or_torch_version_is_named_first():
    job = fp()
    mine = dataclasses.replace(job, package="0.4.0", torch="2.9.0")
    job = dataclasses.replace(job, package="0.3.0")
    assert differences(mine, job) == [
        "lightning_mccl 0.4.0 here, 0.3.0 in the job: install the same version on every Mac",
        f"torch 2.9.0 here, {torch.__version__} in the job: install the same version on every Mac"]


def test_another_config_is_named_by_its_hash():
    here, job = config_hash({"lr": 0.1}), config_hash(CONFIG)
    assert differences(fp({"lr": 0.1}), fp()) == [f"the config differs (hash {here[:12]} here, hash {job[:12]} in "
                                                  f"the job)"]
    assert differences(fp(None), fp()) == [f"the config differs (no config given here, hash {job[:12]} in the job)"]
    assert config_hash({"b": 1, "a": [1, 2]}) == config_hash({"a": [1, 2], "b": 1})  # keys sorted
    assert config_hash("lr=0.05") != config_hash("lr=0.1") and config_hash(None) == ""
    with pytest.raises(TypeError, match=r"^mccl elastic: config must be a string or JSON-able .*: Object of type "
                                        r"object is not JSON serializable$"):
        config_hash({"x": object()})


def test_a_refusal_names_three_differences_and_counts_the_rest():
    found = differences(dataclasses.replace(fp(width=32, head=True, config={}), package="0.4.0"), fp())
    assert refusal(found) == (
        f"lightning_mccl 0.4.0 here, {lightning_mccl.__version__} in the job: install the same version on every "
        f"Mac; its model differs: 'model.fc.weight' is float32[10, 32] here, float32[10, 64] in the job; "
        f"'model.head.weight' (float32[2, 10]) is here, not in the job's model (and 2 more differences)")
    assert refusal(found[:4]) == refusal(found[:3]) + " (and 1 more difference)"
    assert refusal(found[:1]) == found[0]


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
    yield server
    del server


def test_over_the_store_a_joiner_that_matches_passes_and_one_that_differs_is_refused_and_logged(store):
    address = f"127.0.0.1:{store.port}"
    fingerprint.publish(Board(store, "m0", address), fp())
    joiner = Board(store, "(a joiner)", address)
    fingerprint.admit(joiner, fp(), {"host": "mac-2", "pid": 11}, timeout=1.0)
    with pytest.raises(JoinRefused) as refused:
        fingerprint.admit(joiner, fp(width=32), {"host": "mac-3", "pid": 12}, timeout=1.0)
    assert str(refused.value) == ("mccl elastic: this joiner cannot join the job: its model differs: 'model.fc.weight' "
                                  "is float32[10, 32] here, float32[10, 64] in the job")
    assert joiner.add("join/n", 0) == 0  # it never registered
    said = []
    host = Membership(Board(store, "m0", address), "m0", ElasticSettings(), ["m0"], "m0", said.append,
                      global_batch=4)
    host._report_refusals()
    host._report_refusals()  # each refusal is said once
    assert said == ["a joiner on mac-3 (pid 12) was refused: its model differs: 'model.fc.weight' is float32[10, 32] "
                    "here, float32[10, 64] in the job"]


def test_a_joiner_that_finds_no_job_fingerprint_says_so(store):
    address = f"127.0.0.1:{store.port}"
    start = time.monotonic()
    with pytest.raises(ElasticError) as error:
        fingerprint.admit(Board(store, "(a joiner)", address), fp(), {"host": "h", "pid": 1}, timeout=0.3)
    assert str(error.value) == (f"mccl elastic: this joiner found no running job at {address}: host 0's member "
                                f"publishes the job's fingerprint when it starts, and none came within 0.3 s (the "
                                f"elastic timeout). Is the job there an elastic one, and started?")
    assert time.monotonic() - start < 3.0


def test_a_joiner_that_cannot_reach_the_store_names_the_address_the_timeout_and_the_likely_causes(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    start = time.monotonic()
    with pytest.raises(ElasticError) as error:
        ElasticManager.from_env(ElasticSampler(8, 4), dict, lambda state: None, join=True,
                                settings=ElasticSettings(timeout=1.0))
    took = time.monotonic() - start
    assert type(error.value) is ElasticError
    pattern = (re.escape(f"mccl elastic: this joiner cannot reach the job's Store on host 0 at 127.0.0.1:{port} "
                         f"(MASTER_ADDR:MASTER_PORT) within 1 s (the elastic timeout): ") + r"[^\n]+" +
               re.escape(". Is the job running, with its host 0 at that address and port? Or does a firewall on "
                         "host 0 block the port (macOS: System Settings > Network > Firewall)?"))
    assert re.fullmatch(pattern, str(error.value)), str(error.value)
    assert took < 10.0, f"it took {took:.1f} s"
