"""`mccl plan`'s predictions against the fleet stand-in's measured steps (benchmarks/fleet_ddp.py).

    python benchmarks/plan_vs_measured.py --measured runs/fleet_h4 runs/fleet_h8 runs/fleet_h16 \
        --profile b8_share4.json b8_share8.json ... --out runs/plan_vs_measured

Every mccl row of the fleet_ddp result folders (their results.csv) is one of the plan's methods, read from the
row itself: DDP (no hook), torch's bf16 hook, the int8 hook, PowerSGD (its rank: --powersgd-rank, as fleet_ddp
ran it), DiLoCo (its H, delay, fragments and wire type from the row); its bucket size from its DDP options (DDP's own
default when none). Rows of other kinds (Gloo, the engine's bf16 wire under DDP) are left out; --series keeps
only the labels given. For each, with a profile of the same model and batch (`mccl plan --save-profile`; of
those, the one measured with the number of processes sharing the device nearest the row's hosts), the plan
predicts the step for that many hosts with the same code as `mccl plan`, twice:

    profile   from the profile as measured (on the GPU host `--share-device N` for N hosts: the stand-in's N
              ranks share its GPU, so each computes slower than alone, and a bucket is ready when the
              slowest rank's is)
    run       with the profile's times scaled so that its compute step is the run's measured "compute" series
              (same processes, same hosts, same moment): what is left to the plan is the communication

The measured step is fleet_ddp's `step_s`: the median step (the slowest rank's), for DiLoCo the mean per inner
step over whole rounds. Writes comparison.csv, comparison.md and comparison.png (predicted against measured,
with the +-10% band) to --out and prints the table. The target: within 10% at 4 and 8 hosts for every method.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from lightning_mccl.plan import Link, Settings, build_methods, load, predict  # noqa: E402
from lightning_mccl.plan.methods import METHODS  # noqa: E402
from lightning_mccl.switch.rates import line_rate_goodput, parse_rate  # noqa: E402
from sweep import report  # noqa: E402

# fleet_ddp's hooks that are the plan's methods (PowerSGD as the strategy runs it: same-shaped matrices batched)
HOOKS = {"": "ddp", "bf16_hook": "bf16", "int8": "int8", "powersgd_batched": "powersgd"}
DDP_DEFAULT_BUCKETS = (25.0, 1.0)  # MiB: DDP's bucket_cap_mb and first bucket when none is given
TARGET = 0.10  # |predicted / measured - 1| at the TARGET_HOSTS
TARGET_HOSTS = (4, 8)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/plan_vs_measured.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measured", nargs="+", required=True, metavar="DIR", help="fleet_ddp.py --out folders")
    p.add_argument("--profile", nargs="+", action="extend", required=True, metavar="FILE",
                   help="profiles (mccl plan --save-profile): for each row, the one of its batch whose --share-device "
                        "is nearest its hosts")
    p.add_argument("--series", default="", help="only these series labels, comma-separated (default: every "
                                                    "mccl row that is one of the plan's methods)")
    p.add_argument("--rate", default="10gbit", help="the stand-in's link rate (default: %(default)s)")
    p.add_argument("--powersgd-rank", type=int, default=Settings.powersgd_rank,
                   help="PowerSGD's rank in the measured runs (fleet_ddp --powersgd-rank; default: %(default)s)")
    p.add_argument("--judge", choices=("profile", "run"), default="profile",
                   help="which prediction the 10%% target is checked on (default: %(default)s)")
    p.add_argument("--out", default=None, help="output folder (default: runs/bench/plan_vs_measured-<time>)")
    return p


def method_of(row: dict, powersgd_rank: int):
    """(method name, Settings) of a fleet_ddp row, or None when it is none of the plan's methods."""
    if row.get("backend") != "mccl":
        return None
    if row.get("sync_every"):
        wire = {"": "float32", "bf16": "bf16"}.get(row.get("wire_dtype", ""))
        return None if wire is None else ("diloco", Settings(sync_every=int(row["sync_every"]),
                                                             sync_delay=int(row["sync_delay"]), diloco_wire=wire,
                                                             fragments=int(row.get("fragments") or 1)))
    method = HOOKS.get(row.get("hook", ""))
    if method is None or row.get("wire_dtype"):
        return None
    options = dict(kv.split("=", 1) for kv in row.get("ddp_options", "").split())
    bucket, first = ((float(options["bucket_cap_mb"]),) * 2 if "bucket_cap_mb" in options else DDP_DEFAULT_BUCKETS)
    if method == "powersgd":
        return method, Settings(powersgd_rank=powersgd_rank, powersgd_bucket_mb=bucket, first_bucket_mb=first)
    if method == "int8":
        return method, Settings(int8_bucket_mb=bucket, first_bucket_mb=first)
    return method, Settings(bucket_mb=bucket, first_bucket_mb=first)


def read_measured(folder: str) -> list:
    """The rows of a fleet_ddp result folder's results.csv."""
    path = os.path.join(folder, "results.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{folder}: no results.csv (a benchmarks/fleet_ddp.py --out folder?)")
    with open(path) as f:
        return [r for r in csv.DictReader(f) if not r.get("error")]


def compare(args, profiles: dict, measured: list) -> list:
    link = Link(line_rate_goodput(parse_rate(args.rate)) / 8)
    keep = {t.strip() for t in args.series.split(",") if t.strip()}
    out = []
    for folder, rows in measured:
        compute = {(int(r["world"]), int(r["batch_per_rank"])): float(r["time_median_s"])
                   for r in rows if r["series"] == "compute"}
        for r in rows:
            n, batch = int(r["world"]), int(r["batch_per_rank"])
            kind = method_of(r, args.powersgd_rank)
            profile = pick_profile(profiles.get((r["model"], batch), []), n)
            if kind is None or profile is None or (keep and r["series"] not in keep):
                continue
            method, settings = kind
            (m,) = build_methods([method], settings)
            got = float(r.get("step_s") or r["time_median_s"])
            row = {"hosts": n, "batch": batch, "method": method, "series": r["series"], "measured_s": got,
                   "folder": folder, "profile_share_device": profile.share_device, "profile_compute_s": profile.step_s,
                   "measured_compute_s": compute.get((n, batch), ""),
                   "predicted_s": predict(profile, link, [m], [n])[0].step_s}
            if (n, batch) in compute:
                scaled = profile.scaled(compute[n, batch] / profile.step_s)
                row["predicted_run_s"] = predict(scaled, link, [m], [n])[0].step_s
            for key in ("predicted_s", "predicted_run_s"):
                if key in row:
                    row[key.replace("predicted", "error")] = row[key] / got - 1
            out.append(row)
    return sorted(out, key=lambda r: (r["batch"], r["hosts"], METHODS.index(r["method"]), r["series"]))


def pick_profile(candidates: list, hosts: int):
    """The profile measured with the number of processes sharing the device nearest `hosts` (the larger of
    two as near), or None when there is none."""
    return min(candidates, key=lambda p: (abs(p.share_device - hosts), -p.share_device), default=None)


def judged_error(row: dict, judge: str):
    return row["error_s"] if judge == "profile" else row.get("error_run_s")


def table(rows: list, judge: str) -> report.Table:
    cols = ["hosts", "batch", "series", "measured ms", "predicted ms (profile)", "error", "predicted ms (run's "
            "compute)", "error", "compute ms: profile / run", f"within 10% ({judge})"]
    cells = []
    for r in rows:
        err, err_run, judged_err = r["error_s"], r.get("error_run_s"), judged_error(r, judge)
        judged = r["hosts"] in TARGET_HOSTS
        ok = "-" if judged_err is None else "yes" if abs(judged_err) <= TARGET else "NO"
        cells.append([str(r["hosts"]), str(r["batch"]), f"{r['series']} ({r['method']})", f"{r['measured_s'] * 1e3:.0f}",
                      f"{r['predicted_s'] * 1e3:.0f}", f"{err:+.1%}",
                      f"{r['predicted_run_s'] * 1e3:.0f}" if err_run is not None else "",
                      f"{err_run:+.1%}" if err_run is not None else "",
                      f"{r['profile_compute_s'] * 1e3:.0f} (x{r['profile_share_device']}) / "
                      + (f"{r['measured_compute_s'] * 1e3:.0f}" if r["measured_compute_s"] != "" else "-"),
                      ok if judged else f"({ok}: reported)"])
    return cols, cells


NOTES = ["error = predicted / measured - 1. profile: the plan from the profile as measured (xN: N processes shared "
         "the device while it was measured); run's compute: the profile scaled to the run's measured compute series. "
         "The target (10%) holds at 4 and 8 hosts; on the 16-core GPU host the 16- and 24-host rows are short "
         "of cores (benchmarks/record/scaling.md) and reported as measured."]


def plot(path: str, rows: list, title: str):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    markers = {4: "o", 8: "s", 16: "^", 24: "v"}
    for ax, key, name in ((axes[0], "predicted_s", "from the profile"), (axes[1], "predicted_run_s",
                                                                          "from the run's compute step")):
        top = max(max(r["measured_s"], r.get(key, 0.0)) for r in rows) * 1.1e3
        for method in dict.fromkeys(r["method"] for r in rows):
            for n in sorted({r["hosts"] for r in rows}):
                pts = [r for r in rows if r["method"] == method and r["hosts"] == n and key in r]
                if pts:
                    ax.scatter([r["measured_s"] * 1e3 for r in pts], [r[key] * 1e3 for r in pts],
                               marker=markers.get(n, "D"), color=f"C{METHODS.index(method)}",
                               label=f"{method}, {n} hosts")
        ax.plot([0, top], [0, top], color="grey", linewidth=1)
        for f in (1 - TARGET, 1 + TARGET):
            ax.plot([0, top], [0, top * f], color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("measured step ms (fleet stand-in)")
        ax.set_ylabel(f"predicted step ms, {name}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        profiles = defaultdict(list)
        for path in args.profile:
            prof = load(path)
            profiles[prof.model, prof.batch].append(prof)
        measured = [(folder, read_measured(folder)) for folder in args.measured]
        rows = compare(args, profiles, measured)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    if not rows:
        parser.error(f"no measured row is one of the plan's methods with a profile of its model and batch (profiles: "
                     f"{', '.join(f'{m} b{b}' for m, b in profiles)})")
    out = args.out or report.default_out_dir("plan_vs_measured")
    os.makedirs(out, exist_ok=True)
    report.write_csv(os.path.join(out, "comparison.csv"), rows)
    title = f"mccl plan against the fleet stand-in: {', '.join(sorted({m for m, _ in profiles}))}"
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write(f"# mccl plan against the fleet stand-in\n\n- command: `{' '.join(['python', sys.argv[0]] + list(argv or sys.argv[1:]))}`\n"
                f"- profiles: {', '.join(args.profile)}\n- measured: {', '.join(args.measured)}\n\n"
                + report.markdown_table(table(rows, args.judge), NOTES))
    why = plot(os.path.join(out, "comparison.png"), rows, title)
    report.print_table("mccl plan against the fleet stand-in", table(rows, args.judge), NOTES)
    judged = [r for r in rows if r["hosts"] in TARGET_HOSTS and judged_error(r, args.judge) is not None]
    missed = [r for r in judged if abs(judged_error(r, args.judge)) > TARGET]
    sys.stderr.write(f"{'' if why is None else why + '; '}wrote {out}/comparison.csv, comparison.md"
                     f"{'' if why else ', comparison.png'}; {len(judged) - len(missed)} of {len(judged)} rows at "
                     f"{' and '.join(map(str, TARGET_HOSTS))} hosts within {TARGET:.0%} ({args.judge})\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
