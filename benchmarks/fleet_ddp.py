"""The Mac-fleet stand-in: the DDP training step of a timm model on an accelerator, ranks talking over an
emulated switch, with every way to send the gradients compared in the same processes.

    python benchmarks/fleet_ddp.py --nproc 2 --device cpu --model vit_tiny_patch16_224 --img-size 32
    python benchmarks/fleet_ddp.py --hosts 8 --rate 10gbit --device cuda --batch 32 8     # GPU host (root)
    python benchmarks/fleet_ddp.py --hosts 8 --series compute,mccl,mccl:bucket=100,mccl:view:static
    python benchmarks/fleet_ddp.py --hosts 8 --rate 10gbit --device cuda --steps 64 --warmup 4 \
        --series compute,gloo+bf16_hook,mccl-bf16+diloco:H=16,mccl-bf16+diloco:H=32      # DiLoCo: whole rounds
    python benchmarks/fleet_ddp.py --nproc 2 4 --device cpu --model vit_small_patch16_224 --img-size 32 \
        --patch-size 8 --num-classes 10 --batch 4 --series compute,mccl,gloo          # `make bench`: CPU cores

The last: ViT-Small (21.4M parameters, 85.5 MB of float32 gradients per step) on 32x32 images in 8x8 patches,
4 images per rank, computing on the CPU (one thread per rank): a forward/backward short next to the gradient
traffic, as on a fleet of Macs whose GPUs compute a step far faster than these cores.

Every rank computes on --device (cuda: all ranks share GPU 0, float32 with TF32 off, so that one rank computes
at roughly the rate of one Mac's GPU; mps; cpu), on synthetic data, with the model built from the same seed
once per series. The series (sweep/ddp_series.py: compute only, mccl, mccl with wire compression, Gloo, mccl
with torch's comm hooks, DDP settings) take turns step by step on the same data, each step timed as barrier,
zero_grad, forward, backward (DDP's allreduce overlaps it), optimizer step and a device synchronize (--sync
stream: the compute stream's only, what a training loop waits for, so that copies a collective queued on
another stream, such as DiLoCo's staging at a round's end, overlap the next step as they do in training); the
slowest rank's time counts (a DiLoCo series' steps run one after another: sweep/ddp_rank.py). Reported: the
step time (the median; for DiLoCo the mean per inner step over whole rounds), samples/s, efficiency (compute-only
step / step),
exposed communication (step - compute), the ring's time on the wire at the link rate (2(n-1)/n x gradient
bytes / TCP goodput; half of it with 16-bit gradients), and the weights' difference from the first exact series.
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

from lightning_mccl.switch import DEFAULT_CONGESTION  # noqa: E402
from sweep import ddp_series, report  # noqa: E402
from sweep.ddp_series import COMPUTE, DDPSeries  # noqa: E402

DEFAULT_SERIES = "compute,mccl,mccl-bf16,gloo,mccl+bf16_hook,mccl+fp16_hook,mccl+powersgd"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/fleet_ddp.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=None, help="rank counts on loopback (default: 2)")
    p.add_argument("--hosts", type=int, nargs="+", default=None, help="emulated hosts, one rank each (Linux, root)")
    p.add_argument("--rate", default="10gbit", help="link rate of the emulated hosts (default: %(default)s)")
    p.add_argument("--burst", default=None, help="tbf bucket of the emulated links (default: by rate)")
    p.add_argument("--congestion", default=DEFAULT_CONGESTION,
                   help="the emulated hosts' TCP congestion control; 'system': the machine's (default: %(default)s)")
    p.add_argument("--switch", default=None, metavar="TAG", help="run on the emulated switch TAG that is up "
                                                                 "(`mccl switch up`; one --nproc)")
    p.add_argument("--device", choices=("cuda", "mps", "cpu"), default="cpu")
    p.add_argument("--sync", choices=("device", "stream"), default="device",
                   help="what a timed step waits for at its end on cuda: every stream (torch.cuda.synchronize) or "
                        "the compute stream (default: %(default)s)")
    p.add_argument("--series", default=DEFAULT_SERIES, help="see sweep/ddp_series.py (default: %(default)s)")
    p.add_argument("--baseline", default="gloo", help="series the samples/s are compared with (default: gloo)")
    p.add_argument("--model", default="vit_base_patch16_224", help="timm model name (default: %(default)s)")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=None, help="ViT patch size (default: the model's)")
    p.add_argument("--depth", type=int, default=None, help="number of blocks (default: the model's)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch", type=int, nargs="+", default=[8], help="samples per rank per step (default: 8)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps, at least 1; 2 with PowerSGD (default: %(default)s)")
    p.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD matrix rank (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: %(default)s)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="for every rank; repeatable")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench/fleet_ddp-<time>)")
    p.add_argument("--timeout", type=float, default=1800.0, help="limit for each launch, seconds")
    p.add_argument("--pg-timeout", type=float, default=300.0)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        from sweep.ddp_rank import worker

        return worker(args.worker)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = lambda m: sys.stderr.write(f"bench: {m}\n")  # noqa: E731
    try:
        series = ddp_series.parse(args.series)
        env = dict(_kv(item) for item in args.env)
    except ValueError as e:
        parser.error(str(e))
    counts = args.hosts or args.nproc or [2]
    if min(counts) < 2:
        parser.error("DDP needs at least 2 ranks")
    if args.warmup < (2 if any(s.powersgd for s in series) else 1):
        parser.error("--warmup: at least 1 step, 2 with PowerSGD (it compresses from the third step on)")
    for s in series:
        if s.diloco and not s.whole_rounds(args.warmup, args.steps):
            parser.error(f"--steps: {s.label} needs whole rounds of {s.sync_every} steps in the timed steps, after "
                         f"a first round (e.g. --warmup {s.sync_every} --steps {s.sync_every * 2})")
    if args.switch and (len(counts) > 1 or args.hosts):
        parser.error("--switch runs on the hosts that are up: give one --nproc, no --hosts")
    out = args.out or report.default_out_dir("fleet_ddp")
    os.makedirs(out, exist_ok=True)

    from sweep.launch import LaunchFailed, placement

    rows, wheres, failed, steps = [], [], [], []
    for n in counts:
        with placement(n, n if args.hosts else None, args.rate, args.switch, args.burst, log=log,
                       congestion=args.congestion) as where:
            wheres.append(where.describe())
            for batch in args.batch:
                ref_path = os.path.abspath(os.path.join(out, f".ref-n{n}-b{batch}.pt"))
                for k, group in enumerate(ddp_series.launches(series)):
                    spec = {**{key: getattr(args, key) for key in ("model", "img_size", "patch_size", "depth",
                                                                   "num_classes", "steps", "warmup", "threads",
                                                                   "pg_timeout", "device", "sync",
                                                                   "powersgd_rank")},
                            "batch": batch, "series": [s.to_json() for s in group], "ref_path": ref_path,
                            "ref": getattr(ddp_series.reference(series), "label", None),
                            "result": os.path.abspath(os.path.join(out, f".n{n}-b{batch}-launch{k}.json"))}
                    labels = [s.label for s in group]
                    log(f"{args.model}, batch {batch}: {', '.join(labels)} on {where.describe()}")
                    wire = {**env, **group[-1].env}
                    try:
                        result = where.run_worker(__file__, spec, [_EnvOnly(wire)], timeout=args.timeout)
                    except LaunchFailed as e:
                        log(f"{', '.join(labels)}: {e}")
                        failed += [(n, batch, s.label) for s in group if s.backend != "none"]
                        continue
                    rows += add_wire_time(result["rows"], where.link_goodput_gbps())
                    steps += result.get("timeline_steps", [])
                    report_all(args, argv, out, rows, steps, series, failed, wheres, log, quiet=True)  # so far
                if os.path.exists(ref_path):
                    os.remove(ref_path)
    rows = report_all(args, argv, out, rows, steps, series, failed, wheres, log, quiet=False)
    bad = [r for r in rows if r.get("weights_match") == "NO"]
    for r in bad:
        log(f"{r['series']} at {r['world']} ranks, batch {r['batch_per_rank']}: weights differ from "
            f"{r['weights_vs']} by {r['weights_rel_diff']:.2e} of the update")
    return 1 if bad or failed else 0


def report_all(args, argv, out, rows, steps, series, failed, wheres, log, quiet: bool) -> list:
    """Writes the files of everything measured so far (after every launch: a run cut short keeps its rows),
    and timeline_steps.csv: each timed step of every series, the mccl ones split by the engine's timeline."""
    from sweep.ddp_report import write_outputs

    if steps:
        report.write_csv(os.path.join(out, "timeline_steps.csv"), steps)

    rows = finish_rows(rows, [s.label for s in series], args.baseline, failed)
    info = next((r for r in rows if r.get("params")), {})
    header = report.machine_header(argv, "; ".join(dict.fromkeys(wheres)), {
        "model": f"{args.model}, img {args.img_size}{f', patch {args.patch_size}' if args.patch_size else ''}"
                 f"{f', depth {args.depth}' if args.depth else ''}, {args.num_classes} classes: "
                 f"{info.get('params', 0) / 1e6:.2f}M parameters, {info.get('grad_bytes', 0) / 1e6:.1f} MB of float32 "
                 f"gradients per step",
        "step": f"on {args.device}{' (all ranks on GPU 0, fp32, TF32 off)' if args.device == 'cuda' else ''}, "
                f"{'each step ending with the compute stream, not the device; ' if args.sync == 'stream' else ''}"
                f"SGD (momentum 0.9), {args.warmup} warm-up + {args.steps} timed steps, {args.threads} torch "
                f"thread(s) per rank"})
    write_outputs(out, rows, header, args.baseline, log, quiet=quiet)
    return rows


def _kv(item: str):
    k, sep, v = item.partition("=")
    if not sep or not k:
        raise ValueError(f"--env {item!r}: write KEY=VALUE")
    return k, v


class _EnvOnly:
    """What Placement.run_worker needs of a series: its environment."""

    def __init__(self, env):
        self.env_dict = env


def add_wire_time(rows: list, link_gbps) -> list:
    """The ring allreduce's time on the wire for the step's gradients: 2(n-1)/n x bytes / goodput (blank on
    loopback), for the bytes this series sends (half for 16-bit gradients; PowerSGD: not computed)."""
    for r in rows:
        n, grad = r["world"], r["grad_bytes"]
        r["wire_fp32_s"] = 2 * (n - 1) / n * grad / (link_gbps * 1e9) if link_gbps else ""
        r["wire_16bit_s"] = r["wire_fp32_s"] / 2 if link_gbps else ""
        if "tl_ring_bytes" in r:  # what the timeline's collectives needed on the wire
            r["tl_ring_s"] = r["tl_ring_bytes"] / (link_gbps * 1e9) if link_gbps else ""
    return rows


def finish_rows(rows: list, labels: list, baseline: str, failed: list) -> list:
    """Efficiency and exposed communication against the compute series of the same launch; samples/s and the
    ratio to the baseline's samples/s at the same ranks and batch; a row per failed series."""
    out = []
    for r in rows:
        step = r.get("step_s", r["time_median_s"])  # DiLoCo: the mean per inner step over whole rounds
        r = dict(r, samples_per_s=r["world"] * r["batch_per_rank"] / step)
        c = r.get("compute_median_s")
        r["efficiency"] = c / step if c else ""
        r["exposed_comm_s"] = step - c if c else ""
        out.append(r)
    base = {(r["world"], r["batch_per_rank"]): r["samples_per_s"] for r in out if r["series"] == baseline}
    for r in out:
        b = base.get((r["world"], r["batch_per_rank"]))
        r[f"vs_{baseline}"] = r["samples_per_s"] / b if b and r["series"] not in (baseline, COMPUTE) else ""
    out += [{"world": n, "batch_per_rank": b, "series": label, "error": "launch failed (see the log)"}
            for n, b, label in failed]
    # one compute row per (ranks, batch): the first launch's
    seen, kept = set(), []
    for r in sorted(out, key=lambda r: (r["world"], -r["batch_per_rank"], labels.index(r["series"]))):
        key = (r["world"], r["batch_per_rank"], r["series"])
        if key not in seen:
            seen.add(key)
            kept.append(r)
    return kept


if __name__ == "__main__":
    sys.exit(main())
