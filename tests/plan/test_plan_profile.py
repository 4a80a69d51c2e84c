"""mccl plan's compute profile, measured on the CPU for a tiny module:Class model: the gradients in the order
backward produced them (the last layer first) with their ready times inside the backward pass, DDP's buckets
from that order equal to torch's own assignment, the methods' device work, the same with two processes
sharing the device (each time the latest over the processes, then the median over the steps), and a model
that cannot be fed named."""
from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from lightning_mccl.plan.buckets import MIB, assign  # noqa: E402
from lightning_mccl.plan.measure import MeasureError, MeasureSpec, combine, measure  # noqa: E402
from lightning_mccl.plan.models import ModelError, ModelSpec  # noqa: E402

MODEL = '''
import torch

class Tiny(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.embed = torch.nn.Linear(32, width)
        self.body = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, 10)
        self.example_input_array = torch.zeros(2, 32)

    def forward(self, x):
        return self.head(torch.relu(self.body(torch.relu(self.embed(x)))))

class Unfed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(4, 4)
'''


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    (tmp_path / "plan_tiny_model.py").write_text(textwrap.dedent(MODEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    return ModelSpec("plan_tiny_model:Tiny", init_args={"width": 96})


def spec(model, share=1):
    return MeasureSpec(model, batch=4, device="cpu", steps=2, warmup=1, share_device=share,
                       powersgd_ranks=(1, 2), kernel_bytes=256 << 10, kernel_repeats=2, timeout_s=120)


def test_a_profile_has_every_gradient_in_backward_order_inside_the_backward_pass(tiny):
    prof = measure(spec(tiny))
    assert [p.name for p in prof.params] == ["head.bias", "head.weight", "body.bias", "body.weight", "embed.bias",
                                             "embed.weight"]
    assert [p.shape for p in prof.params][:2] == [(10,), (10, 96)]
    assert prof.problem() is None
    assert 0 < prof.forward_s <= min(p.ready_s for p in prof.params) and prof.backward_s <= prof.step_s
    assert (prof.model, prof.model_args, prof.batch, prof.share_device) == ("plan_tiny_model:Tiny",
                                                                          {"init_args": {"width": 96}}, 4, 1)
    k = prof.kernels
    assert all(getattr(k, f) > 0 for f in ("bf16_encode", "bf16_decode", "pseudo_gradient", "outer_step"))
    assert sorted(k.powersgd) == [1, 2] and all(c.p_s > 0 and c.q_s > 0 and c.d_s > 0 for c in k.powersgd.values())


def test_the_profiles_order_buckets_as_torch_does(tiny):
    import torch.distributed as dist

    prof = measure(spec(tiny))
    module = __import__("plan_tiny_model").Tiny(96)
    by_name = dict(module.named_parameters())
    names = list(by_name)
    order = [names.index(p.name) for p in prof.params]
    tensors = [by_name[p.name] for p in prof.params]
    cap = 16 << 10  # bytes: a few buckets for this model
    want, _ = dist._compute_bucket_assignment_by_size(tensors, [cap, cap], [False] * len(tensors), order)
    got = assign([(p.nbytes, p.value_bytes) for p in prof.params], cap, cap)
    assert [[order[i] for i in b] for b in got] == want
    assert len(want) > 1 and MIB > cap


def test_processes_sharing_the_device_measure_together(tiny):
    prof = measure(spec(tiny, share=2))
    assert prof.share_device == 2 and prof.problem() is None and len(prof.params) == 6


def test_a_sharing_process_that_fails_is_named_with_its_cause(tiny):
    with pytest.raises(MeasureError, match="profiling process [01] of 2 failed: ModelError: plan_tiny_model:Unfed "
                                           "has no example_input_array"):
        measure(spec(ModelSpec("plan_tiny_model:Unfed"), share=2))


def test_a_model_without_example_input_is_named(tiny):
    with pytest.raises(ModelError, match="plan_tiny_model:Unfed has no example_input_array tensor"):
        measure(spec(ModelSpec("plan_tiny_model:Unfed")))
    with pytest.raises(ModelError, match="plan_tiny_model:Nope: plan_tiny_model has no Nope"):
        measure(spec(ModelSpec("plan_tiny_model:Nope")))
    with pytest.raises(ModelError, match="Tiny\\(depth=3\\): TypeError"):
        measure(spec(ModelSpec("plan_tiny_model:Tiny", init_args={"depth": 3})))


def test_shared_runscombine_as_the_latest_process_then_the_median_step():
    def run(steps, ready_b, ready_a, kernel):
        return {"steps": [{"forward": 0.1, "backward": s - 0.02, "step": s, "order": ["b", "a"],
                           "ready": {"b": rb, "a": ra}} for s, rb, ra in zip(steps, ready_b, ready_a)],
                "kernels": {"bf16_encode": kernel, "bf16_decode": kernel, "pseudo_gradient": kernel,
                            "outer_step": kernel,
                            "powersgd_1_p": kernel, "powersgd_1_q": kernel, "powersgd_1_d": kernel},
                "device_name": "test", "torch": "x", "params": [("a", (4, 4), 4), ("b", (4,), 4)]}

    runs = [run([0.30, 0.40, 0.31], [0.15, 0.20, 0.16], [0.25, 0.30, 0.26], [1e-9, 5e-9]),
            run([0.32, 0.33, 0.50], [0.17, 0.14, 0.30], [0.27, 0.28, 0.45], [2e-9, 3e-9])]
    prof = combine(MeasureSpec(ModelSpec("m"), 4, "cpu", steps=3, kernel_repeats=2, powersgd_ranks=(1,)), runs)
    # per step the later process: steps 0.32, 0.40, 0.50 -> median 0.40; b ready 0.17, 0.20, 0.30 -> 0.20
    assert prof.step_s == pytest.approx(0.40) and prof.backward_s == pytest.approx(0.38)
    assert [(p.name, p.shape, p.ready_s) for p in prof.params] == [("b", (4,), pytest.approx(0.20)),
                                                                  ("a", (4, 4), pytest.approx(0.30))]
    # kernels: per repeat the later, 2e-9 and 5e-9, median 3.5e-9
    assert prof.kernels.outer_step == pytest.approx(3.5e-9) and prof.kernels.powersgd[1].q_s == pytest.approx(3.5e-9)
