"""benchmarks/diloco_sim.py against what it simulates, on a one-block ViT for a few steps: its DiLoCo (stacked,
vmap'd workers, the product's outer loop over a simulated allreduce) against 8 separate models averaged by hand,
one step late (H = 1) and at once (the warm start), and its DDP mode (one model on the global batch) against its
workers averaging their gradients every step."""
from __future__ import annotations

import functools

import pytest
import torch

import diloco_sim as sim
from accuracy.rank import GlobalBatchSampler
from lightning_mccl.recipes.vit import warmup_cosine

TINY = {"embed_dim": 32, "depth": 1, "num_heads": 2}
STEPS, WORKERS, BATCH, SEED = 5, 8, 4, 3


@pytest.fixture
def data():
    """Images and labels, and float64 as the default dtype (the models are built in it) while the test runs: in
    float32 AdamW turns rounding in gradients that are zero in exact arithmetic (the attention's key bias) into
    steps of its learning rate, in float64 only DiLoCo's own float32 anchor rounds."""
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    g = torch.Generator().manual_seed(0)
    yield (torch.randn(96, 3, sim.IMAGE, sim.IMAGE, generator=g, dtype=torch.float64),
           torch.randint(0, sim.CLASSES, (96,), generator=g))
    torch.set_default_dtype(was)


def run(text: str, x: torch.Tensor, y: torch.Tensor) -> dict:
    _, setting = sim.parse_run(f"r:steps={STEPS},workers={WORKERS},batch={BATCH},{text}")
    return sim.train(setting, SEED, x, y, "cpu", model_kwargs=TINY)[1]


def delayed_averaging(x: torch.Tensor, y: torch.Tensor, delay: int = 1) -> dict:
    """DiLoCo with H=1, sync_delay=1, outer_lr=1, outer_momentum=0 written out: after its own AdamW step, worker
    i holds the mean of all workers' weights of one step earlier plus its own latest update,
    w_i(t) = mean_j w_j(t-1) + (w_i(t) - w_i(t-1)); at the end every worker holds mean_j w_j(T). delay=0 (the
    warm start): after every step each worker holds the mean of the workers' weights, w_i(t) = mean_j w_j(t)."""
    from timm.optim import param_groups_weight_decay

    models = [sim.build(SEED, "vit_tiny_patch16_224", TINY, "cpu") for _ in range(WORKERS)]
    opts, scheds = [], []
    for m in models:
        groups = param_groups_weight_decay(m, sim.WEIGHT_DECAY, no_weight_decay_list=m.no_weight_decay())
        opts.append(torch.optim.AdamW(groups, lr=1e-3))
        scheds.append(torch.optim.lr_scheduler.LambdaLR(opts[-1], functools.partial(
            warmup_cosine, warmup=round(0.1 * STEPS), total=STEPS)))
    params = [list(m.parameters()) for m in models]
    for idx in GlobalBatchSampler(len(y), STEPS, WORKERS * BATCH, 0, 1, SEED):
        before = [[p.detach().clone() for p in ps] for ps in params]
        for i, (m, opt, sched) in enumerate(zip(models, opts, scheds)):
            mine = idx[i * BATCH:(i + 1) * BATCH]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x[mine]), y[mine], label_smoothing=sim.LABEL_SMOOTHING).backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            for k in range(len(params[0])):
                if delay == 0:
                    mean_now = torch.stack([ps[k] for ps in params]).mean(0)
                    for ps in params:
                        ps[k].copy_(mean_now)
                    continue
                mean_before = torch.stack([b[k] for b in before]).mean(0)
                for ps, b in zip(params, before):
                    ps[k].add_(mean_before - b[k])
    with torch.no_grad():
        return {n: torch.stack([dict(m.named_parameters())[n] for m in models]).mean(0)
                for n, _ in models[0].named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_diloco_h1_is_delayed_averaging_and_ddp_is_gradient_averaging(data):
    x, y = data
    start = {n: p.detach() for n, p in sim.build(SEED, "vit_tiny_patch16_224", TINY, "cpu").named_parameters()}
    h1 = run("H=1,outer_lr=1,outer_momentum=0,sync_delay=1", x, y)
    ref = delayed_averaging(x, y)
    moved = max_diff(ref, start)  # 5 AdamW steps at lr <= 1e-3: about 3e-3
    assert moved > 1e-3
    # DiLoCo's anchor is float32: the weights (|w| < 2) round to within 2 * 2^-24 at each of the 5 outer steps
    assert max_diff(h1, ref) < 1e-6, "the simulated DiLoCo is not the workers' delayed averaging"
    ddp = run("mode=ddp", x, y)
    assert max_diff(run(f"sync_steps={STEPS}", x, y), ddp) < 1e-12, "DDP mode is not gradient averaging"
    # the two differ (the delay, and averaging weights after AdamW rather than gradients before it), and so does
    # worker 0 alone, by far more than the tolerances: the checks above tell a wrong simulation from a right one
    assert max_diff(h1, ddp) > 0.1 * moved
    assert max_diff(run("mode=single", x, y), ddp) > 0.1 * moved


def test_the_warm_start_is_averaging_at_once_and_fragments_all_sync_in_a_round_of_one_step(data):
    """warm=STEPS: every step a round of one step applied at once, the workers' weights averaged after every
    AdamW step (each worker keeps its own AdamW moments: not DDP's step, which the sim's sync_steps is); with
    H = 1, fragments each sync every step, the same numbers as the whole model's sync; with H = 4, 4 fragments
    sync on 4 different steps and end elsewhere."""
    x, y = data
    warm, ref = run(f"warm={STEPS},H=4", x, y), delayed_averaging(x, y, delay=0)
    assert max_diff(warm, ref) < 1e-6, "the warm start is not averaging at once"
    assert max_diff(warm, delayed_averaging(x, y)) > 1e-4  # one step late is something else
    assert max_diff(run("H=1,fragments=3", x, y), run("H=1", x, y)) == 0.0
    assert max_diff(run("H=4,fragments=4", x, y), run("H=4", x, y)) > 1e-4


@pytest.mark.parametrize("text, message", [
    ("r:H=0", "sync_every=0"),
    ("r:H=4,sync_delay=5", "sync_delay=5"),
    ("r:outer_momentum=1", "outer_momentum=1"),
    ("r:mode=sync", "mode must be one of"),
    ("r:steps=8,sync_steps=9", "sync_steps must be from 0 to steps"),
    ("r:warm=-1", "warm_start=-1"),
    ("r:fragments=0", "fragments=0"),
    ("r:H=4,qsr=0.002", "the H schedule needs a cap, max_sync_every"),
    ("r:H=4,qsr=0.002,H_max=2", "max_sync_every=2"),
    ("r:Hx=1", "unknown setting 'Hx'"),
    ("r:H=two", "H='two', expected int"),
    ("H=1", "a name first"),
])
def test_bad_runs_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        sim.parse_run(text)


def test_finetune_start_is_the_ranks_start(tmp_path):
    """--finetune: a simulated worker starts where convergence.py --finetune's ranks do (the recipe's
    ViTClassifier with checkpoint_path, built after seeding): the checkpoint's weights but the head, which is the
    seed's own, new one, for the new task's classes."""
    import lightning as L

    from accuracy.rank import ConvergenceViT

    pretrained = sim.build(7, "vit_tiny_patch16_224", TINY, "cpu")
    path = str(tmp_path / "backbone.pth")
    torch.save(pretrained.state_dict(), path)
    start = sim.build(SEED, "vit_tiny_patch16_224", TINY, "cpu", classes=6, checkpoint=path).state_dict()
    L.seed_everything(SEED, verbose=False)
    rank = ConvergenceViT(model_name="vit_tiny_patch16_224", num_classes=6, img_size=sim.IMAGE,
                          patch_size=sim.PATCH, model_kwargs=TINY, checkpoint_path=path).model.state_dict()
    fresh = sim.build(SEED, "vit_tiny_patch16_224", TINY, "cpu", classes=6).state_dict()
    assert start.keys() == rank.keys()
    for name, value in start.items():
        assert torch.equal(value, rank[name]), name
        if name.startswith("head."):
            assert value.shape[0] == 6 and torch.equal(value, fresh[name]), name
        else:
            assert torch.equal(value, pretrained.state_dict()[name]), name
    assert not torch.equal(start["patch_embed.proj.weight"], fresh["patch_embed.proj.weight"])  # seeds 7 and 3
