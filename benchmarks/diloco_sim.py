"""DiLoCo's accuracy on the convergence benchmark's task, simulated in one process, fast enough to sweep its settings.

    python benchmarks/diloco_sim.py --run ddp:mode=ddp --run h4:H=4 --run paper-h8:H=8,outer_lr=0.7,outer_momentum=0.9 \
        --seeds 0 1 2
    python benchmarks/diloco_sim.py --device cuda --jobs 8 --runs-file benchmarks/accuracy/diloco_sweep.txt \
        --seeds 0 1 2 --out runs/diloco_sim
    python benchmarks/diloco_sim.py --finetune --run ddp:mode=ddp --run h4:H=4 --seeds 0 1 2

It replays `benchmarks/convergence.py`'s 8-rank runs (benchmarks/record/convergence.md): the same glyph task (drawn from
data seed 0 with convergence.py's task settings), the same model and initial weights (`torch.manual_seed(seed)` then
the recipe's timm ViT; its attention unfused, see `build`), the same AdamW with the recipe's parameter groups, warm-up
and cosine, the same global batches in the same order (accuracy/rank.py's GlobalBatchSampler; past one epoch it
draws the next permutation, as convergence.py does) with rank r's slice going to worker r, and the product's own
outer loop: one `lightning_mccl.diloco.DiLoCo` per simulated worker, its schedule, its outer step and its delayed
apply, unchanged. Only the transport is simulated: the workers' parameters are slices of stacked tensors (one vmap'd
forward and backward for all workers, one AdamW over the stack, which is elementwise and so is one AdamW per
worker), and the allreduce is the mean over the workers' vectors (with `wire=bf16`, each hop of a ring narrowed to
bfloat16 and summed in float32). tests/benchmarks/test_diloco_sim.py checks it against 8 separate models.

A run is `NAME:key=value,...` (defaults in RUN_DEFAULTS; the outer step's are the product's): mode (diloco | ddp:
one model on the global batch, as synchronous DDP | single: worker 0 alone), H, outer_lr, outer_momentum, sync_delay
(1 to H, as DiLoCo accepts), lr (the inner peak learning rate), warmup (share of the steps), wire (fp32 | bf16),
workers, batch (per worker), steps (the budget: 256 steps of 8 x 8 images is convergence.py's), sync_steps (that
many first steps synchronous, the workers' gradients averaged as by DDP, before DiLoCo starts from the weights they
reached: post-local SGD), and DiLoCo's options for short jobs: warm (its warm_start: that many first steps each a
round of one step applied at once, the workers' progress averaged after their own AdamW steps), fragments (1, the
whole model, unless given: not the strategy's "auto"), qsr
(qsr_alpha, 0: off) and H_max (max_sync_every, with qsr), e.g. `frag4:H=4,fragments=4`, `warm32:H=4,warm=32`,
`qsr:H=4,qsr=0.002,H_max=16`. benchmarks/record/diloco.md ("What DiLoCo costs in accuracy") has the sweep's
results.

--finetune replays `convergence.py --finetune` instead (benchmarks/record/convergence.md, "Fine-tuning"): its fine-tuning task,
each worker starting from its pretrained model (the same cache, and the same key: one pretraining serves both
scripts) with a new head, and an inner learning rate of 5e-4 unless a run sets lr.

Output in --out: results.csv (a row per run and seed as it ends: the final validation accuracy and loss of the
anchor, i.e. of what every rank holds after `finish()`; a run and seed already there is not run again, so a sweep
cut short, by --timeout or otherwise, resumes), results.md and stdout (per run: the mean and spread over seeds, and
the difference from the `mode=ddp` run of the same steps, paired by seed), results.png (the same, with error bars).
"""
from __future__ import annotations

import argparse
import csv
import functools
import multiprocessing
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from accuracy import finetune, pretrain  # noqa: E402
from accuracy.rank import VAL_BATCH, GlobalBatchSampler  # noqa: E402
from accuracy.task import GlyphTask, load  # noqa: E402
from convergence import DEFAULT_MODEL_KWARGS, FINETUNE_LR, TASK_DEFAULTS, pretraining_of  # noqa: E402
from lightning_mccl.diloco import OUTER_LR, OUTER_MOMENTUM, DiLoCo, check_schedule, check_settings  # noqa: E402
from lightning_mccl.recipes.vit import warmup_cosine  # noqa: E402
from sweep import report  # noqa: E402

RUN_DEFAULTS = {"mode": "diloco", "H": 8, "outer_lr": OUTER_LR, "outer_momentum": OUTER_MOMENTUM, "sync_delay": 1,
                "lr": 1e-3, "warmup": 0.1, "wire": "fp32", "workers": 8, "batch": 8, "steps": 256, "sync_steps": 0,
                "warm": 0, "fragments": 1, "qsr": 0.0, "H_max": 0}
MODES, WIRES = ("diloco", "ddp", "single"), ("fp32", "bf16")
CLASSES, IMAGE, PATCH, WEIGHT_DECAY, LABEL_SMOOTHING = 32, 16, 4, 0.05, 0.1  # convergence.py's and the recipe's
FIELDS = ["name", "seed", "final_acc", "final_loss", "seconds", "device", "setting"]
TARGET = 1.0  # points below DDP that issue 27 allows DiLoCo


def parse_run(text: str, finetune: bool = False) -> tuple:
    """`NAME:key=value,...` -> (name, setting); ValueError naming the run and the setting. `finetune`: the inner
    learning rate's default is convergence.py --finetune's."""
    name, _, body = text.partition(":")
    if not name or "," in name or "=" in name:
        raise ValueError(f"run {text!r}: expected NAME:key=value,... (a name first)")
    setting = dict(RUN_DEFAULTS, **({"lr": FINETUNE_LR} if finetune else {}))
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in RUN_DEFAULTS:
            raise ValueError(f"run {text!r}: unknown setting {key!r} (known: {', '.join(RUN_DEFAULTS)})")
        try:
            setting[key] = type(RUN_DEFAULTS[key])(value)
        except ValueError:
            raise ValueError(f"run {text!r}: {key}={value!r}, expected {type(RUN_DEFAULTS[key]).__name__}") from None
    if setting["mode"] not in MODES or setting["wire"] not in WIRES:
        raise ValueError(f"run {text!r}: mode must be one of {MODES}, wire one of {WIRES}")
    if not 0 <= setting["sync_steps"] <= setting["steps"]:
        raise ValueError(f"run {text!r}: sync_steps must be from 0 to steps = {setting['steps']}")
    if setting["mode"] == "diloco":
        check_settings(setting["H"], setting["outer_lr"], setting["outer_momentum"], setting["sync_delay"],
                       f"run {name}")
        check_schedule(setting["H"], setting["warm"], setting["fragments"], setting["qsr"] or None,
                       setting["H_max"] or None, f"run {name}")
    return name, setting


def describe(setting: dict) -> str:
    """The settings that differ from RUN_DEFAULTS (the mode always), as `key=value ...`."""
    return " ".join(f"{k}={v}" for k, v in setting.items() if v != RUN_DEFAULTS[k] or k == "mode")


class SimMean:
    """The outer allreduce over `workers` simulated workers. Each worker's `start` adds its vector to the round of
    its fragment (a round is full once every worker started); the round's first `wait` puts the mean into every
    vector of it: sum then divide, as AllreduceMean; with bf16, each hop of a ring narrowed to bfloat16, summed in
    float32. A wait on a round not every worker started raises: the simulation would average fewer vectors."""

    def __init__(self, wire: str, workers: int) -> None:
        self.wire, self.workers, self.rounds = wire, workers, {}

    def start(self, flat: torch.Tensor, part: int = 0) -> "_Round":
        round_ = self.rounds.get(part)
        if round_ is None or len(round_.flats) == self.workers:
            round_ = self.rounds[part] = _Round(self.wire, self.workers)
        round_.flats.append(flat)
        return round_


class _Round:
    def __init__(self, wire: str, workers: int) -> None:
        self.wire, self.workers, self.flats, self.done = wire, workers, [], False

    def wait(self) -> None:
        if self.done:
            return
        if len(self.flats) != self.workers:
            raise RuntimeError(f"SimMean: a wait on a round {len(self.flats)} of {self.workers} workers started")
        if self.wire == "bf16":
            total = self.flats[0].bfloat16().float()
            for f in self.flats[1:]:
                total = (total + f.bfloat16().float()).bfloat16().float()
        else:
            total = torch.stack(self.flats).sum(0)
        total.div_(len(self.flats))
        for f in self.flats:
            f.copy_(total)
        self.done = True


def build(seed: int, model_name: str, model_kwargs: dict, device: str, classes: int = CLASSES,
          checkpoint: str = "") -> torch.nn.Module:
    """The model convergence.py's ranks start from: timm's initialisation from `seed_everything(seed)`, and with
    `checkpoint` (--finetune) the weights in it but the head's, loaded as the recipe loads them. Its attention
    computes softmax(q k^T) v with matmuls rather than the fused kernel (the same function): vmap has a
    batching rule for every op of it, on every device, where the fused kernels depend on the torch version."""
    import timm

    from lightning_mccl.recipes.vit import load_backbone, read_state_dict

    torch.manual_seed(seed)
    model = timm.create_model(model_name, pretrained=False, num_classes=classes, img_size=IMAGE, patch_size=PATCH,
                              **model_kwargs)
    if checkpoint:
        load_backbone(model, read_state_dict(checkpoint), checkpoint)
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return model.to(device)


def start_diloco(setting: dict, stacked: dict, workers: int, opt: torch.optim.Optimizer) -> list:
    """A DiLoCo per worker, on views of the worker's slice of the stacked parameters, sharing one SimMean, reading
    the learning rate of `opt` (the H schedule); the anchor is the workers' (equal) weights, as after
    `broadcast()`."""
    mean, outer = SimMean(setting["wire"], workers), []
    for w in range(workers):
        shadow = torch.nn.ParameterList([torch.nn.Parameter(t.detach()[w]) for t in stacked.values()])
        d = DiLoCo(shadow, setting["H"], outer_lr=setting["outer_lr"], outer_momentum=setting["outer_momentum"],
                   sync_delay=setting["sync_delay"], warm_start=setting["warm"], fragments=setting["fragments"],
                   qsr_alpha=setting["qsr"] or None, max_sync_every=setting["H_max"] or None, averaging=mean)
        with torch.no_grad():
            d.anchor.copy_(torch.cat([p.reshape(-1) for p in d.params]))
        d.attach(opt, step_hook=False)  # the workers' steps run in lockstep below, not on the hook
        outer.append(d)
    return outer


def step_all(outer: list) -> None:
    """DiLoCo.step() for all workers in lockstep, as ranks run it side by side: every worker's first half (the
    outer steps due, the syncs that start) before any worker's second half (the outer steps applied at once, which
    wait for every worker's sync)."""
    for d in outer:
        d._begin_step()
    for d in outer:
        d._end_step()


def finish_all(outer: list) -> None:
    """DiLoCo.finish() for all workers in lockstep (one worker's finish alone would wait on syncs the others have
    not started): the pending outer steps and the last syncs' starts, then their outer steps and every worker's
    weights := anchor."""
    for d in outer:
        d._finish_starts()
    for d in outer:
        d._finish_applies()


def train(setting: dict, seed: int, x: torch.Tensor, y: torch.Tensor, device: str,
          model_name: str = "vit_tiny_patch16_224", model_kwargs: dict = DEFAULT_MODEL_KWARGS, classes: int = CLASSES,
          checkpoint: str = "") -> tuple:
    """Trains as the run says; returns (the model, the final parameters of worker 0 by name)."""
    from timm.optim import param_groups_weight_decay
    from torch.func import functional_call, vmap

    model = build(seed, model_name, model_kwargs, device, classes, checkpoint)
    mode = setting["mode"]
    workers = setting["workers"] if mode == "diloco" else 1
    batch = setting["batch"] * (setting["workers"] if mode == "ddp" else 1)  # per simulated worker
    stacked = {n: p.detach().unsqueeze(0).repeat(workers, *[1] * p.dim()).clone().requires_grad_()
               for n, p in model.named_parameters()}
    by_id = {id(p): stacked[n] for n, p in model.named_parameters()}
    no_decay = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    groups = [{**g, "params": [by_id[id(p)] for p in g["params"]]}
              for g in param_groups_weight_decay(model, WEIGHT_DECAY, no_weight_decay_list=no_decay)]
    opt = torch.optim.AdamW(groups, lr=setting["lr"])
    steps = setting["steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(
        warmup_cosine, warmup=min(steps, int(round(setting["warmup"] * steps))), total=steps))

    def loss_of(params, images, labels):
        return F.cross_entropy(functional_call(model, params, (images,)), labels, label_smoothing=LABEL_SMOOTHING)

    losses, outer = vmap(loss_of), []
    sampler = GlobalBatchSampler(len(y), steps, setting["batch"] * setting["workers"], 0, 1, seed)
    for step, idx in enumerate(sampler):
        if mode == "diloco" and step == setting["sync_steps"]:
            outer = start_diloco(setting, stacked, workers, opt)
        idx = torch.tensor(idx[:workers * batch], device=device).view(workers, batch)
        opt.zero_grad(set_to_none=True)
        losses(stacked, x[idx], y[idx]).sum().backward()
        if mode == "diloco" and not outer:  # a synchronous step: every worker takes the mean gradient
            for t in stacked.values():
                t.grad.copy_(t.grad.mean(0, keepdim=True).expand_as(t.grad))
        opt.step()
        step_all(outer)
        sched.step()
    if outer:
        finish_all(outer)
    return model, {n: t.detach()[0] for n, t in stacked.items()}


def evaluate(model: torch.nn.Module, params: dict, vx: torch.Tensor, vy: torch.Tensor) -> tuple:
    """(accuracy, mean cross-entropy) of `params` on the validation set."""
    from torch.func import functional_call

    correct, loss_sum = 0, 0.0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(vy), VAL_BATCH):
            logits = functional_call(model, params, (vx[i:i + VAL_BATCH],))
            correct += int((logits.argmax(1) == vy[i:i + VAL_BATCH]).sum())
            loss_sum += float(F.cross_entropy(logits, vy[i:i + VAL_BATCH], reduction="sum"))
    return correct / len(vy), loss_sum / len(vy)


def _job(args: tuple) -> dict:
    name, setting, seed, data, model_name, device, threads, checkpoint = args
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as convergence.py's CPU ranks compute
    torch.backends.cudnn.allow_tf32 = False
    task, tensors = load(data)
    x, y, vx, vy = (t.to(device) for t in tensors)
    start = time.perf_counter()
    model, params = train(setting, seed, x, y, device, model_name, classes=task.classes, checkpoint=checkpoint)
    acc, loss = evaluate(model, params, vx, vy)
    row = {"name": name, "seed": seed, "final_acc": round(acc, 5), "final_loss": round(loss, 4),
           "seconds": round(time.perf_counter() - start, 1), "device": device, "setting": describe(setting)}
    print(f"{name} seed {seed}: {100 * acc:.2f}% ({row['seconds']} s)", flush=True)
    return row


def _read_rows(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarise(runs: list, rows: list, seeds: list) -> tuple:
    """A table row per run (its rows for `seeds`): mean ± sd over seeds, the paired difference from the first
    `mode=ddp` run of the same steps, and whether it is within TARGET points; also the plot's points."""
    acc = {(r["name"], int(r["seed"])): 100 * float(r["final_acc"]) for r in rows}
    refs = {}
    for name, s in runs:
        if s["mode"] == "ddp":
            refs.setdefault(s["steps"], name)
    cols = ["run", "setting", "seeds", "final val acc %", "vs DDP (pts)", f"within {TARGET:g} pt", "per seed"]
    cells, points = [], []
    for name, s in runs:
        mine = [(seed, acc[name, seed]) for seed in seeds if (name, seed) in acc]
        if not mine:
            cells.append([name, describe(s), "0", "not ended", "", "", ""])
            continue
        values = [a for _, a in mine]
        mean, sd = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
        ref = refs.get(s["steps"])
        diffs = [a - acc[ref, seed] for seed, a in mine if ref is not None and (ref, seed) in acc]
        vs, ok = "", ""
        if diffs and ref != name:
            dsd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            d = statistics.fmean(diffs)
            vs, ok = f"{d:+.2f} ± {dsd:.2f}", "yes" if d >= -TARGET else "no"
        cells.append([name, describe(s), str(len(values)), f"{mean:.2f} ± {sd:.2f}", vs, ok,
                      ", ".join(f"{a:.2f}" for a in values)])
        points.append((name, mean, sd, ref == name, s["mode"] == "ddp"))
    return (cols, cells), points


def plot(path: str, title: str, points: list) -> str:
    """A bar per run (mean, error bar one sd over seeds; DDP's grey), and each reference DDP's mean - TARGET."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no results.png"
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(points) + 1.5))
    names = [p[0] for p in points]
    ax.barh(range(len(points)), [p[1] for p in points], xerr=[p[2] for p in points], capsize=2,
            color=["tab:grey" if p[4] else "tab:blue" for p in points])
    for _, mean, _, is_ref, _ in points:
        if is_ref:
            ax.axvline(mean - TARGET, color="tab:red", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(points)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"final validation accuracy % (mean ± sd over seeds); dashed: DDP - {TARGET:g} pt")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/diloco_sim.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", default=[], metavar="NAME:k=v,...", help="a setting; repeatable")
    p.add_argument("--runs-file", help="more runs, one a line (# comments)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--model", default="vit_tiny_patch16_224", help="timm model, with convergence.py's kwargs")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: every job on GPU 0")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each in a process of --threads threads")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=None, help="the task's file, drawn once if missing (default: runs/glyphs.pt, "
                   "with --finetune runs/glyphs_finetune.pt)")
    p.add_argument("--out", default=None, help="folder: results.csv (appended to), .md, .png (default: "
                   "runs/diloco_sim, with --finetune runs/diloco_sim_finetune)")
    p.add_argument("--finetune", action="store_true", help="convergence.py --finetune's case: its fine-tuning task, "
                   "from its pretrained model (pretrained and cached first if --pretrain-cache has none); the "
                   f"runs' lr defaults to {FINETUNE_LR:g}")
    p.add_argument("--pretrain-cache", default=os.path.join("runs", "pretrained"), help="as convergence.py's")
    p.add_argument("--timeout", type=float, default=0, help="seconds: then the runs not ended are stopped and the "
                   "table shows those that ended (default: none)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    lines = list(args.run)
    if args.runs_file:
        with open(args.runs_file) as f:
            lines += [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]
    runs = [parse_run(r, args.finetune) for r in lines]
    names = [n for n, _ in runs]
    if not runs or len(set(names)) != len(names):
        p.error(f"give runs with distinct names (got {names})")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    suffix = "_finetune" if args.finetune else ""
    args.data, args.out = args.data or f"runs/glyphs{suffix}.pt", args.out or f"runs/diloco_sim{suffix}"
    task, checkpoint = GlyphTask(**TASK_DEFAULTS), ""  # convergence.py's task, data seed 0
    if args.finetune:
        torch.set_num_threads(args.threads)
        pre = pretraining_of(task, {"model_name": args.model, "patch_size": PATCH,
                                    "model_kwargs": DEFAULT_MODEL_KWARGS}, args.device)
        checkpoint, _ = pretrain.ensure(pre, args.pretrain_cache, report.machine_header(argv, "")["command"], print)
        task = finetune.shifted(task, {})
    if not os.path.exists(args.data):
        os.makedirs(os.path.dirname(os.path.abspath(args.data)), exist_ok=True)
        task.save(args.data)
    elif load(args.data)[0] != task:
        p.error(f"--data {args.data} holds another task than {task.describe()}")
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "results.csv")
    done = {(r["name"], int(r["seed"]), r["setting"]) for r in _read_rows(csv_path)}
    jobs = [(n, s, seed, args.data, args.model, args.device, args.threads, checkpoint) for n, s in runs
            for seed in args.seeds if (n, seed, describe(s)) not in done]
    jobs.sort(key=lambda j: -j[1]["steps"])  # the longest first: the pool ends together
    print(f"{len(jobs)} runs to do ({len(runs) * len(args.seeds) - len(jobs)} already in {csv_path})", flush=True)
    new = not os.path.exists(csv_path)
    with open(csv_path, "a", newline="") as f, multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        results = pool.imap_unordered(_job, jobs, chunksize=1)
        for _ in jobs:  # a row as each run ends: a sweep cut short keeps its rows, and resumes from them
            try:
                row = results.next(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except multiprocessing.TimeoutError:
                print(f"--timeout {args.timeout:g} s: the runs not ended are stopped", flush=True)
                pool.terminate()
                break
            w.writerow(row)
            f.flush()
    wanted = {(n, describe(s)) for n, s in runs}
    rows = [r for r in _read_rows(csv_path) if (r["name"], r["setting"]) in wanted]
    table, points = summarise(runs, rows, args.seeds)
    title = f"DiLoCo simulated on convergence.py's task: final validation accuracy, seeds {args.seeds}"
    header = report.machine_header(argv, f"{args.device}, {args.jobs} jobs")
    notes = [f"vs DDP: the paired (same seed) difference from the first mode=ddp run of the same steps, mean ± "
             f"sd over seeds; within {TARGET:g} pt: issue 27's target for DiLoCo."]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(report.markdown(title, header, table, notes))
    why = plot(os.path.join(args.out, "results.png"), title, points)
    print("\n" + report.markdown_table(table, notes))
    print(why or f"wrote {args.out}/results.csv, results.md, results.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
