"""DDP training-step time of a timm Vision Transformer on CPU: mccl against Gloo in the same run.

    python benchmarks/ddp_vit.py --nproc 4                       # loopback
    python benchmarks/ddp_vit.py --hosts 4 --rate 10gbit         # 4 emulated hosts (Linux, root)
    python benchmarks/ddp_vit.py --nproc 2 4                     # one run per rank count, one table

Every rank builds the same model once per series (same seed), wrapped in DistributedDataParallel on that
series' process group, plus a "compute" copy without DDP (the step with no communication at all). The
series take turns step by step on the same data, each step timed as barrier + zero_grad, forward, backward
(DDP's gradient allreduce overlaps it) and the optimizer step; the slowest rank's time counts. Reported:
median step time, samples/s over all ranks, the ratio to Gloo, the model's parameters and gradient bytes,
and whether the mccl and Gloo replicas ended with the same weights.

The default model, ViT-Small (21.4M parameters, 85.5 MB of float32 gradients per step) on 32x32 images in 8x8
patches, 4 images per rank, keeps the forward/backward short next to the gradient traffic, as on a fleet of
Macs whose GPUs compute a step far faster than these CPU cores: the backends' difference shows.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from sweep import report  # noqa: E402
from sweep.series import Series, launch_groups, parse_series  # noqa: E402

COMPUTE = "compute"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/ddp_vit.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=None, help="rank counts (default: 2 4)")
    p.add_argument("--hosts", type=int, default=None, help="emulated hosts (one rank each; overrides --nproc)")
    p.add_argument("--rate", default="10gbit", help="link rate of the emulated hosts (default: %(default)s)")
    p.add_argument("--burst", default=None, help="tbf bucket of the emulated links (default: by rate)")
    p.add_argument("--switch", default=None, metavar="TAG", help="run on the emulated switch TAG that is up")
    p.add_argument("--series", default="mccl,gloo", help="as in allreduce.py (default: %(default)s)")
    p.add_argument("--baseline", default="gloo")
    p.add_argument("--model", default="vit_small_patch16_224", help="timm model name (default: %(default)s)")
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--depth", type=int, default=None, help="override the number of blocks")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=4, help="samples per rank per step (default: %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: %(default)s)")
    p.add_argument("--no-compute", action="store_true", help="skip the no-DDP compute baseline")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="for every rank; repeatable")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench/ddp_vit-<time>)")
    p.add_argument("--timeout", type=float, default=3600.0, help="limit for each launch, seconds")
    p.add_argument("--pg-timeout", type=float, default=600.0)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    # SIGTERM as an exception: the ranks are stopped and a throwaway switch is taken down on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = lambda m: sys.stderr.write(f"bench: {m}\n")  # noqa: E731
    try:
        env = dict(_kv(item) for item in args.env)
        series = parse_series(args.series, env)
    except ValueError as e:
        parser.error(str(e))
    counts = [args.hosts] if args.hosts else (args.nproc or [2, 4])
    if min(counts) < 2:
        parser.error("--nproc: DDP needs at least 2 ranks")
    if args.switch and len(counts) > 1:
        parser.error("--switch runs one rank count: give one --nproc")
    out = args.out or report.default_out_dir("ddp_vit")
    os.makedirs(out, exist_ok=True)

    from sweep.launch import LaunchFailed, placement

    rows, wheres, model_info = [], [], {}
    try:
        for n in counts:
            with placement(n, args.hosts, args.rate, args.switch, args.burst, log=log) as where:
                wheres.append(where.describe())
                for k, group in enumerate(launch_groups(series)):
                    spec = {**{key: getattr(args, key) for key in ("model", "img_size", "patch_size", "depth",
                                                                   "num_classes", "batch", "steps", "warmup",
                                                                   "threads", "pg_timeout")},
                            "series": [s.to_json() for s in group], "compute": not args.no_compute and k == 0,
                            "result": os.path.abspath(os.path.join(out, f".n{n}-launch{k}.json"))}
                    log(f"DDP {args.model}: {', '.join(s.label for s in group)} on {where.describe()}")
                    result = where.run_worker(__file__, spec, group, timeout=args.timeout)
                    rows += result["rows"]
                    model_info = result["model"]
    except (LaunchFailed, ValueError, RuntimeError) as e:
        log(str(e))
        return 1
    labels = ([COMPUTE] if not args.no_compute else []) + [s.label for s in series]
    rows = finish_rows(rows, labels, args.baseline)
    header = report.machine_header(argv, "; ".join(dict.fromkeys(wheres)), {
        "model": f"{args.model}, img {args.img_size}, patch {args.patch_size}"
                 f"{f', depth {args.depth}' if args.depth else ''}: {model_info.get('params', 0) / 1e6:.2f}M "
                 f"parameters, {model_info.get('grad_bytes', 0) / 1e6:.1f} MB of gradients per step",
        "step": f"batch {args.batch} per rank, SGD (momentum 0.9), {args.warmup} warm-up + {args.steps} timed steps, "
                f"{args.threads} torch thread(s) per rank"})
    write_outputs(out, rows, header, labels, args.baseline, log)
    bad = [r for r in rows if r.get("weights_match") == "NO"]
    for r in bad:
        log(f"{r['series']} at {r['world']} ranks ended with weights differing from {r['weights_vs']} by "
            f"{r['weights_max_diff']:.2e}")
    return 1 if bad else 0


def _kv(item: str):
    k, sep, v = item.partition("=")
    if not sep or not k:
        raise ValueError(f"--env {item!r}: write KEY=VALUE")
    return k, v


# -- the ranks ------------------------------------------------------------------------------------------------


def make_model(spec: dict):
    import timm
    import torch

    torch.manual_seed(0)
    kwargs = dict(img_size=spec["img_size"], patch_size=spec["patch_size"], num_classes=spec["num_classes"])
    if spec.get("depth"):
        kwargs["depth"] = spec["depth"]
    return timm.create_model(spec["model"], pretrained=False, **kwargs)


def worker(spec_path: str) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sweep.rank import init_groups, say, summarize

    with open(spec_path) as f:
        spec = json.load(f)
    series = [Series.from_json(s) for s in spec["series"]]
    groups = init_groups(series, spec["pg_timeout"])
    torch.set_num_threads(spec["threads"])
    rank, world = dist.get_rank(), dist.get_world_size()

    models = {s.label: DDP(make_model(spec), process_group=groups[s.label]) for s in series}
    if spec["compute"]:
        models[COMPUTE] = make_model(spec)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in models.items()}
    labels = list(models)
    params = sum(p.numel() for p in models[labels[0]].parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in models[labels[0]].parameters() if p.requires_grad)

    def batch(step: int):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(spec["batch"], 3, spec["img_size"], spec["img_size"], generator=g)
        y = torch.randint(0, spec["num_classes"], (spec["batch"],), generator=g)
        return x, y

    def train_step(label: str, x, y) -> None:
        opts[label].zero_grad(set_to_none=True)
        F.cross_entropy(models[label](x), y).backward()
        opts[label].step()

    total = spec["warmup"] + spec["steps"]
    times = torch.zeros(spec["steps"], len(labels), dtype=torch.float64)
    for i in range(total):
        x, y = batch(i)
        for j in range(len(labels)):
            k = (i + j) % len(labels)
            dist.barrier()
            t0 = time.perf_counter()
            train_step(labels[k], x, y)
            if i >= spec["warmup"]:
                times[i - spec["warmup"], k] = time.perf_counter() - t0
        if i == spec["warmup"] - 1 or i == total - 1:
            say(f"{world} ranks: step {i + 1}/{total}")
    dist.all_reduce(times, op=dist.ReduceOp.MAX)

    # the DDP replicas saw the same data from the same start: their weights must agree across backends
    ref = series[0].label
    flat = {s.label: torch.cat([p.detach().reshape(-1) for p in models[s.label].module.parameters()])
            for s in series}
    rows = []
    for k, label in enumerate(labels):
        row = {"model": spec["model"], "world": world, "series": label,
               "backend": next((s.backend for s in series if s.label == label), "none"),
               "batch_per_rank": spec["batch"], "params": params, "grad_bytes": grad_bytes,
               **summarize(times[:, k].tolist())}
        if label in flat and label != ref:
            diff = (flat[label] - flat[ref]).abs().max().item()
            row.update(weights_vs=ref, weights_max_diff=diff, weights_match="yes" if diff <= 1e-4 else "NO")
        rows.append(row)
    if rank == 0:
        with open(spec["result"], "w") as f:
            json.dump({"rows": rows, "model": {"params": params, "grad_bytes": grad_bytes}}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# -- the report -----------------------------------------------------------------------------------------------


def finish_rows(rows: list, labels: list, baseline: str) -> list:
    base = {r["world"]: r["time_median_s"] for r in rows if r["series"] == baseline}
    out = []
    for r in sorted(rows, key=lambda r: (r["world"], labels.index(r["series"]))):
        r = dict(r, samples_per_s=r["world"] * r["batch_per_rank"] / r["time_median_s"])
        b = base.get(r["world"])
        r[f"time_vs_{baseline}"] = r["time_median_s"] / b if b and r["series"] != baseline else ""
        out.append(r)
    return out


def write_outputs(out: str, rows: list, header: dict, labels: list, baseline: str, log) -> None:
    cols = ["ranks", "series", "steps", "step ms (median)", "min", "max", "samples/s", f"time / {baseline}",
            "same weights"]
    cells = []
    for r in rows:
        ratio = r[f"time_vs_{baseline}"]
        same = "" if "weights_match" not in r else f"{r['weights_match']} ({r['weights_max_diff']:.1e})"
        cells.append([str(r["world"]), r["series"], str(r["iters"]), f"{r['time_median_s'] * 1e3:.1f}",
                      f"{r['time_min_s'] * 1e3:.1f}", f"{r['time_max_s'] * 1e3:.1f}", f"{r['samples_per_s']:.1f}",
                      f"{ratio:.2f}" if ratio != "" else "", same])
    notes = [f"step: barrier, then zero_grad + forward + backward (with DDP's allreduce) + SGD step; the slowest "
             f"rank's time; median (min, max) over the timed steps. samples/s = ranks x batch / median step. "
             f"time / {baseline}: below 1 is faster than {baseline}. {COMPUTE}: the same step without DDP (no "
             f"communication). same weights: largest |difference| from the first series' weights at the end."]
    title = f"DDP step time, {rows[0]['model'] if rows else ''}"
    report.write_csv(os.path.join(out, "results.csv"), rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown(title, header, (cols, cells), notes))
    worlds = sorted({r["world"] for r in rows})
    panels = [
        {"ylabel": "step ms (median)", "xlabel": "ranks", "xticks": (worlds, [str(w) for w in worlds]),
         "series": {lab: ([r["world"] for r in rows if r["series"] == lab],
                          [r["time_median_s"] * 1e3 for r in rows if r["series"] == lab]) for lab in labels}},
        {"ylabel": "samples/s", "xlabel": "ranks", "xticks": (worlds, [str(w) for w in worlds]),
         "series": {lab: ([r["world"] for r in rows if r["series"] == lab],
                          [r["samples_per_s"] for r in rows if r["series"] == lab]) for lab in labels}},
    ]
    why = report.plot(os.path.join(out, "results.png"), f"{title}: {header['where']}", panels)
    if why:
        log(why)
    report.print_table(f"{title} ({header['where']})", (cols, cells), notes)
    log(f"wrote {out}/results.csv, results.md{'' if why else ', results.png'}")


if __name__ == "__main__":
    sys.exit(main())
