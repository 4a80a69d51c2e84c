"""What each way of sending gradients does to accuracy: the same ViT trained for the same number of samples with
every method (synchronous float32 DDP, torch's bf16 hook, PowerSGD at rank 1 and 4, int8 with error feedback,
DiLoCo at two values of H), through the product's own path: Lightning's `Trainer` with `MCCLStrategy(...)`, the
ranks started as `mccl launch --local N` starts them.

    python benchmarks/convergence.py                  # 8 CPU ranks, a small ViT (benchmarks/record/convergence.md)
    python benchmarks/convergence.py --seeds 0 1 2 --methods ddp-fp32,int8,diloco-h2,diloco-h4
    python benchmarks/convergence.py --device cuda --model vit_small_patch16_224 --model-kwargs '{}' ...
    python benchmarks/convergence.py --step-times fleet/results.csv --step-series int8=mccl+int8

The task is a synthetic image classification of controllable difficulty (accuracy/task.py), drawn once from
--data-seed; every method and seed sees the same images. Per seed, every method starts from the same model and
takes the same global batches in the same order (accuracy/rank.py). Reported per method: the validation
accuracy and loss against samples, and against the wall time the same number of steps would take on the 8-host
fleet stand-in at its measured step time (accuracy/step_times.py); the final accuracy's mean and spread over
seeds, its difference from synchronous float32 DDP and whether that is within the seed noise and meets issue 27's
target (accuracy/summary.py). A method MCCLStrategy does not accept (not built yet) is reported as
"unavailable: <the error>" and the others run. Files: results.md, summary.csv, curves.csv, results.png
(accuracy/output.py).

    python benchmarks/convergence.py --finetune --seeds 0 1 2         # fine-tuning a pretrained ViT instead

--finetune: the same methods fine-tune one pretrained model on a related task instead of training from random
weights. The model is pretrained once on the task the options above describe (the from-scratch task), in one
process, and cached in --pretrain-cache (accuracy/pretrain.py); the methods then fine-tune it, with a new head,
on that task shifted by accuracy/finetune.py's SHIFT and --finetune-task, and the controls (methods.CONTROLS:
DDP from random weights) run too. A linear probe of the pretrained and of random features on the new
task is reported beside them (pretrained.json). --pretrain-only stops once the pretrained model is cached.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from accuracy import finetune, output, pretrain, step_times  # noqa: E402
from accuracy import methods as methods_table  # noqa: E402
from accuracy.summary import Outcome  # noqa: E402
from accuracy.task import GlyphTask, load  # noqa: E402
from sweep import report  # noqa: E402

# The CPU defaults (8 ranks on 2 cores; how long: benchmarks/record/convergence.md): ViT-Tiny's patch embedding and head
# around 4 blocks 128 wide, 16x16 images in 4x4 patches (0.81M parameters); 256 steps of 64 images.
DEFAULT_MODEL_KWARGS = {"embed_dim": 128, "depth": 4, "num_heads": 4}
# The task's defaults here: that ViT under synchronous DDP ends near 70% after the default budget
# (benchmarks/record/convergence.md, *The task*).
TASK_DEFAULTS = {"classes": 32, "shift": 1.0, "noise": 0.1, "background": 0.2, "distractors": 1}
LR, FINETUNE_LR = 1e-3, 5e-4  # AdamW's peak learning rate from random weights, and when fine-tuning
PRETRAIN_STEPS, PRETRAIN_BATCH = 2048, 64  # --finetune's pretraining: 131k samples, 6.5 passes over the task
WORKER = "--worker"  # first argument of the ranks' command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/convergence.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=8, help="ranks on this machine (default: %(default)s)")
    p.add_argument("--device", choices=("cpu", "cuda", "mps"), default="cpu",
                   help="where every rank computes (cuda: all on GPU 0)")
    p.add_argument("--methods", default=None, help="comma-separated names (default: with no --method, all: "
                   f"{', '.join(m.name for m in methods_table.METHODS)}, and with --finetune "
                   f"{', '.join(m.name for m in methods_table.CONTROLS)}); {methods_table.REFERENCE} always runs")
    p.add_argument("--method", action="append", default=[], metavar="NAME=JSON",
                   help="another method: a name and MCCLStrategy keyword arguments as JSON; repeatable (without "
                        "--methods, only these and the reference run)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="model and data-order seeds (default: 0)")
    p.add_argument("--samples", type=int, default=16384, help="training samples per run, all ranks (default: "
                   "%(default)s); rounded down to whole evaluation intervals")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step (default: %(default)s)")
    p.add_argument("--evals", type=int, default=8, help="validation points per run (default: %(default)s)")
    p.add_argument("--model", default="vit_tiny_patch16_224", help="timm model (default: %(default)s)")
    p.add_argument("--model-kwargs", default=json.dumps(DEFAULT_MODEL_KWARGS), metavar="JSON",
                   help="more timm.create_model arguments (default: %(default)s; '{}': the model's own)")
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help=f"AdamW's peak learning rate (default: {LR:g}, "
                   f"{FINETUNE_LR:g} with --finetune)")
    p.add_argument("--warmup", type=float, default=0.1, help="share of the steps in warm-up (default: %(default)s)")
    task = p.add_argument_group("the task (accuracy/task.py)")
    for name, field in GlyphTask.__dataclass_fields__.items():
        task.add_argument(f"--{name.replace('_', '-')}", type=type(field.default),
                          default=TASK_DEFAULTS.get(name, field.default), help="(default: %(default)s)")
    ft = p.add_argument_group("fine-tuning a pretrained model (accuracy/pretrain.py, accuracy/finetune.py)")
    ft.add_argument("--finetune", action="store_true", help="fine-tune a model pretrained on the task above, on "
                    "that task shifted, instead of training from random weights")
    ft.add_argument("--finetune-task", default="{}", metavar="JSON", help="the fine-tuning task's settings that "
                    f"differ from the pretraining task's, over {json.dumps(finetune.SHIFT)}")
    ft.add_argument("--pretrain-steps", type=int, default=PRETRAIN_STEPS, help="(default: %(default)s)")
    ft.add_argument("--pretrain-batch", type=int, default=PRETRAIN_BATCH, help="images per step (default: "
                    "%(default)s)")
    ft.add_argument("--pretrain-lr", type=float, default=LR, help="(default: %(default)s)")
    ft.add_argument("--pretrain-seed", type=int, default=0, help="(default: %(default)s)")
    ft.add_argument("--pretrain-cache", default=os.path.join("runs", "pretrained"),
                    help="folder of pretrained models, one per key (default: %(default)s)")
    ft.add_argument("--pretrain-only", action="store_true", help="stop once the pretrained model is cached")
    steps = p.add_argument_group("step times on the fleet stand-in (accuracy/step_times.py)")
    steps.add_argument("--step-times", action="append", default=[], metavar="FILE",
                       help="a fleet_ddp.py results.csv; repeatable, later files win")
    steps.add_argument("--step-series", action="append", default=[], metavar="METHOD=SERIES",
                       help="the series of those files that measured METHOD; repeatable")
    steps.add_argument("--step-world", type=int, default=8, help="their rows at this many ranks (default: 8)")
    steps.add_argument("--step-batch", type=int, default=8, help="and this batch per rank (default: 8)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank, and of the pretraining "
                   "(default: %(default)s)")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench/convergence-<time>)")
    p.add_argument("--timeout", type=float, default=1800.0, help="limit for each method's launch, seconds")
    p.add_argument("--pg-timeout", type=float, default=300.0, help="the process group's timeout, seconds")
    return p



def plan_steps(samples: int, global_batch: int, evals: int, periods) -> tuple:
    """(steps, eval_every): validation every `eval_every` steps, a multiple of every DiLoCo period (so that the
    points fall at the end of a round), `steps` a whole number of those intervals, at most samples / batch."""
    unit = math.lcm(*periods) if periods else 1
    total = samples // global_batch
    eval_every = max(unit, total // max(evals, 1) // unit * unit)
    steps = total // eval_every * eval_every
    if steps == 0:
        raise ValueError(f"--samples {samples}: fewer than one evaluation interval ({eval_every} steps of "
                         f"{global_batch} samples)")
    return steps, eval_every


def log(message: str) -> None:
    sys.stderr.write(f"convergence: {message}\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nproc < 2:
        parser.error("--nproc: at least 2 ranks")
    if args.pretrain_only and not args.finetune:
        parser.error("--pretrain-only: only with --finetune")
    try:
        chosen = methods_table.select(args.methods.split(",") if args.methods else None, args.method,
                                      controls=args.finetune)
        task = GlyphTask(**{k: getattr(args, k) for k in GlyphTask.__dataclass_fields__})
        model_kwargs = json.loads(args.model_kwargs)
        if args.finetune:
            pretraining, task = task, finetune.shifted(task, json.loads(args.finetune_task))
            if min(args.pretrain_steps, args.pretrain_batch) < 1:
                raise ValueError(f"--pretrain-steps {args.pretrain_steps}, --pretrain-batch {args.pretrain_batch}: "
                                 f"at least 1 each")
        times = step_times.resolve(chosen, args.step_times, args.step_series, args.step_world, args.step_batch)
        steps, eval_every = plan_steps(args.samples, args.batch * args.nproc, args.evals,
                                       methods_table.diloco_periods(chosen))
    except (ValueError, OSError) as e:
        parser.error(str(e))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lr = args.lr if args.lr is not None else FINETUNE_LR if args.finetune else LR
    model = {"model_name": args.model, "patch_size": args.patch_size, "model_kwargs": model_kwargs}
    header = report.machine_header(argv, f"{args.nproc} ranks on this machine over loopback, {args.device}", {
        "task": task.describe(),
        "model": f"{args.model} {model_kwargs or ''}, patch {args.patch_size}; AdamW lr {lr} (weight decay "
                 f"0.05, label smoothing 0.1), warm-up {args.warmup:g} of the steps then cosine to 0",
        "budget": f"{steps} optimizer steps of {args.batch} x {args.nproc} = {args.batch * args.nproc} images "
                  f"({steps * args.batch * args.nproc} samples), validation every {eval_every} steps",
        "seeds": " ".join(map(str, args.seeds)),
        "step times": "; ".join(step_times.sources(times))})
    if args.finetune:
        torch.set_num_threads(args.threads)  # pretraining and the probes: one process, as one rank computes
        pre = pretraining_of(pretraining, model, args.device, args.pretrain_steps, args.pretrain_batch,
                             args.pretrain_lr, args.pretrain_seed)
        weights, record = pretrain.ensure(pre, args.pretrain_cache, header["command"], log)
        if args.pretrain_only:
            return 0
        model["checkpoint_path"] = os.path.abspath(weights)
    out = args.out or report.default_out_dir("convergence")
    os.makedirs(out, exist_ok=True)
    common = {"comm_metrics": False, "timeout": args.pg_timeout}
    outcomes = [Outcome(m, refusal(m, common)) for m in chosen]
    data = os.path.abspath(os.path.join(out, ".data.pt"))
    log(f"drawing the task: {task.describe()}")
    task.save(data)
    spec = {"data": data, "seeds": args.seeds, "steps": steps, "batch": args.batch, "eval_every": eval_every,
            "device": args.device, "threads": args.threads, "strategy_common": common,
            "model": {**model, "num_classes": task.classes, "img_size": task.image_size, "lr": lr,
                      "warmup_epochs": args.warmup}}  # one epoch is the whole run (rank.py's sampler)
    if args.finetune:
        transfer(spec["model"], task, load(data)[1], args.device, pre, record, out, header)
    try:
        run_all(outcomes, spec, args, out, times, steps, header)
    finally:
        os.remove(data)
    output.write(out, outcomes, times, steps, header, log, of_what(args))
    return 1 if any(o.status.startswith("failed") for o in outcomes) else 0


def pretraining_of(task: GlyphTask, model: dict, device: str, steps: int = PRETRAIN_STEPS,
                   batch: int = PRETRAIN_BATCH, lr: float = LR, seed: int = 0) -> pretrain.Pretraining:
    """The pretraining of `model` (ConvergenceViT's model_name, patch_size, model_kwargs) on `task`; by default
    this script's (diloco_sim.py --finetune takes the same, and so the same cached model)."""
    return pretrain.Pretraining(task, {**model, "lr": lr, "warmup_epochs": pretrain.WARMUP}, steps, batch, seed,
                                device)


def of_what(args) -> str:
    """What the steps are, in the table's title."""
    return " of fine-tuning" if args.finetune else ""


def transfer(model: dict, task: GlyphTask, tensors, device: str, pre, record: dict, out: str, header: dict) -> None:
    """The pretrained model and the linear probes of its features and of random ones on the fine-tuning task,
    in the header and in OUT/pretrained.json."""
    log("linear probes of the pretrained and of random features on the fine-tuning task")
    probes = finetune.probes(model, task.classes, tensors, device)
    with open(os.path.join(out, "pretrained.json"), "w") as f:
        json.dump({"weights": model["checkpoint_path"], "record": record, "linear_probe": probes}, f, indent=1)
    header["pretrained model"] = (f"{pre.describe()}: {100 * record['pretrain_val_acc']:.2f}% on its validation "
                                  f"set; cached as {model['checkpoint_path']}, by `{record['command']}`")
    header["linear probe on this task"] = (f"pretrained features {100 * probes['pretrained']:.2f}%, random "
                                           f"features {100 * probes['random']:.2f}% (accuracy/finetune.py)")


def refusal(method, common) -> str:
    """"ok", or "unavailable: <error>" when the method's strategy refuses its arguments (a choice that is not
    built yet, on this branch). An argument that MCCLStrategy does not name goes on to DistributedDataParallel
    (its **kwargs), so one that neither names is refused here too, rather than in every rank's DDP."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    import lightning_mccl.lightning

    cls = getattr(lightning_mccl.lightning, method.cls)
    named = set(inspect.signature(cls.__init__).parameters)
    if not method.diloco:
        named |= set(inspect.signature(DistributedDataParallel.__init__).parameters)
    unknown = sorted(set(method.strategy) - named)
    if unknown:
        return (f"unavailable: {method.cls} takes no {', '.join(unknown)}" + ("" if method.diloco else
                f" (it would pass {'it' if len(unknown) == 1 else 'them'} to DistributedDataParallel, which does "
                f"not either)"))
    try:
        cls(**method.strategy, **common)
    except Exception as e:  # TypeError for an unknown argument, ValueError for an unknown choice, ...
        return f"unavailable: {type(e).__name__}: {e}"
    return "ok"


def run_all(outcomes, spec, args, out, times, steps, header) -> None:
    """One launch of the ranks per method, all seeds in it; the files are rewritten after each."""
    from sweep.launch import LaunchFailed, placement

    todo = [o for o in outcomes if o.ok]
    for o in outcomes:
        if not o.ok:
            log(f"{o.method.name}: {o.status}")
    with placement(args.nproc, log=log) as where:
        for k, o in enumerate(todo):
            result = os.path.abspath(os.path.join(out, f".{o.method.name}.json"))
            with open(result.replace(".json", ".spec.json"), "w") as f:
                json.dump({**spec, "method": o.method.to_json(), "result": result}, f)
            log(f"{o.method.name} ({k + 1}/{len(todo)}): {json.dumps(o.method.strategy)}, seeds "
                f"{' '.join(map(str, args.seeds))}, {steps} steps on {where.describe()}")
            start = time.perf_counter()
            try:
                where.run([sys.executable, os.path.abspath(__file__), WORKER,
                           result.replace(".json", ".spec.json")], env={}, timeout=args.timeout)
                o.runs = collect(result, args.nproc)
            except (LaunchFailed, OSError, ValueError) as e:
                o.status = f"failed: {first_error(result, args.nproc) or e}"
            finally:
                for r in [result.replace(".json", ".spec.json")] + [result.replace(".json", f".rank{i}.json")
                                                                     for i in range(args.nproc)]:
                    if os.path.exists(r):
                        os.remove(r)
            fits = [max(r["fit_s"] for r in runs) for runs in o.runs.values()]
            log(f"{o.method.name}: {o.status}, {time.perf_counter() - start:.0f} s for the launch, "
                f"{sum(fits):.0f} s of it in Trainer.fit")
            # a run cut short keeps its rows
            output.write(out, outcomes, times, steps, header, log, of_what(args), quiet=True)


def first_error(result: str, nproc: int) -> str:
    """The error the lowest failing rank recorded (rank.py writes it before exiting), or ""."""
    for i in range(nproc):
        try:
            with open(result.replace(".json", f".rank{i}.json")) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            continue
        if "error" in saved:
            return f"rank {i}: {saved['error']}"
    return ""


def collect(result: str, nproc: int) -> dict:
    """{seed: [rank 0's run, ...]} from the ranks' files; ValueError when one is missing."""
    ranks = []
    for i in range(nproc):
        path = result.replace(".json", f".rank{i}.json")
        if not os.path.exists(path):
            raise ValueError(f"rank {i} wrote no results ({path})")
        with open(path) as f:
            saved = json.load(f)
        if "error" in saved:
            raise ValueError(f"rank {i}: {saved['error']}")
        ranks.append(saved["runs"])
    return {run["seed"]: [r[j] for r in ranks] for j, run in enumerate(ranks[0])}


if __name__ == "__main__":
    if sys.argv[1:2] == [WORKER]:  # a rank of a launch (run_all): the spec file follows
        from accuracy.rank import worker

        worker(sys.argv[2])
    sys.exit(main())
