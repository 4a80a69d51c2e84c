"""Elastic training under churn, a join and mixed speeds, on CPU members over loopback (or a GPU's, --device
cuda): docs/elastic.md's targets, measured.

    python benchmarks/churn.py                                     # every case, a small MLP, 4 members
    python benchmarks/churn.py --cases steady,churn --leave-every 60 --back-after 30 --churn-epochs 200
    bash benchmarks/gpu_host/run.sh churn                          # ViT-B/16 on a GPU (timm), 8 members

The members run on this machine over loopback only: the emulated switch's placement (benchmarks/sweep/) runs
its ranks under the launcher's supervision, which ends the job when one of them exits. With --link-rate, the
join's heal time (its state crossing loopback) is compared with the state's transfer time at that rate.

Cases (each a fresh job of member processes, benchmarks/elastic/member.py, AdamW on synthetic data):

  steady  no churn (--steady-epochs): the elastic loop, and plain synchronous DDP over a ProcessGroupMCCL
          (elastic off); the steady-state step time of both (no regression with elasticity on)
  churn   a member other than host 0 is asked to leave (SIGTERM) every --leave-every s and is back as a joiner
          --back-after s later (its process is started at the leave, imports torch and builds its model, and
          joins at that time); samples/s per member present against steady's (target >= 0.95)
  join    --members - 1 members train; after --warm-steps a joiner starts: its heal time, from the boundary that
          admits it to its first step (the group re-formed, the state sent and loaded), the state's bytes, and
          the heal time against the state's transfer time at --link-rate Gbit/s (target <= 1.5x) when given
  mixed   2 of the members at half speed, pacing on and off: samples/s against the sum of the members' own
          rates (target >= 0.9), as each member's manager measured it with equal shares (the pacing-off run:
          its step's own work, its waits for the others left out)

A host's compute is emulated by a sleep per sample (--sample-s) on top of the model's forward and backward, so
that N members on a machine of fewer cores behave as N hosts; a slower Mac sleeps --slow-factor times as long per
sample and sleeps (factor - 1) times its forward and backward's duration after them. Each case's ledger check:
every id of every epoch trained exactly once. Prints a table; writes results.csv, results.md, results.png and
each case's member records into --out; exits 1 when a ledger check fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from elastic import measure  # noqa: E402
from elastic.job import Job  # noqa: E402
from sweep import report  # noqa: E402

CASES = ("steady", "churn", "join", "mixed")
TARGETS = {"churn": 0.95, "join": 1.5, "mixed": 0.9}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of " + ", ".join(CASES))
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--model", default="mlp", help="mlp, or a timm model name (timm needed)")
    p.add_argument("--width", type=int, default=512, help="the MLP's width")
    p.add_argument("--depth", type=int, default=3, help="the MLP's hidden layers")
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-samples", type=int, default=256, help="samples per epoch")
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=4, help="epochs of the join and mixed cases")
    p.add_argument("--steady-epochs", type=int, default=20, help="epochs of the steady case (churn's baseline)")
    p.add_argument("--churn-epochs", type=int, default=60)
    p.add_argument("--sample-s", type=float, default=0.01, help="seconds of emulated compute per sample")
    p.add_argument("--slow-factor", type=float, default=2.0, help="the mixed case's slow members: times slower")
    p.add_argument("--leave-every", type=float, default=20.0, help="seconds between leaves (churn)")
    p.add_argument("--back-after", type=float, default=10.0, help="seconds until the member is back (churn)")
    p.add_argument("--warm-steps", type=int, default=4, help="join: committed steps before the joiner starts")
    p.add_argument("--link-rate", type=float, default=None,
                   help="Gbit/s of the link the state crosses, for the join target (loopback: leave unset)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each job may take")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = set(args.cases) - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")
    if args.members < 3:
        p.error("--members must be at least 3 (host 0 stays, and the mixed case slows 2 others)")
    return args


def spec(args, epochs: int, **over) -> dict:
    return {"model": args.model, "width": args.width, "depth": args.depth, "device": args.device,
            "num_samples": args.num_samples, "global_batch": args.global_batch, "epochs": epochs, "elastic": True,
            "pace": True, "sample_s": args.sample_s, "slow": {}, "warm_file_at": args.warm_steps, "await_joiner": False,
            **over}


def deadline(args) -> float:
    return time.monotonic() + args.timeout


def run_plain(args, out: Path, epochs: int, **over):
    job = Job(out, args.members, spec(args, epochs, **over))
    job.wait(deadline(args))
    return job.records()


def run_churn(args, out: Path) -> tuple:
    """Leaves and joins on the clock while host 0 trains; returns (records, leaves, joins)."""
    job = Job(out, args.members, spec(args, args.churn_epochs, warm_file_at=1))
    end = deadline(args)
    job.await_file("warm", end)
    t0, joins, back = time.monotonic(), 0, []
    while job.running("m0"):
        now = time.monotonic()
        if now - t0 >= args.leave_every * (len(job.asked) + 1):
            victim = next((n for n in job.procs if n != "m0" and n not in job.asked and job.running(n)
                           and job.training(n)), None)
            if victim is not None:
                job.leave(victim)
                back.append((now + args.back_after, job.join(go=True)))
        if back and now >= back[0][0]:
            job.cue(back.pop(0)[1])
            joins += 1
        job.check(end, "host 0 still trained")
        time.sleep(0.05)
    late = time.monotonic() + 30.0  # the others finish; a joiner that came after the last step is stopped
    while any(job.running(n) for n in job.procs) and time.monotonic() < late:
        time.sleep(0.1)
    for name in [n for n in job.procs if job.running(n)]:
        job.procs[name].kill()
        job.procs[name].wait()
    return job.records(), len(job.asked), joins


def run_join(args, out: Path) -> dict:
    job = Job(out, args.members - 1, spec(args, args.epochs, await_joiner=True))
    end = deadline(args)
    job.await_file("warm", end)
    job.join()
    job.wait(end)
    return job.records()


def row(case: str, variant: str, records: dict, args, epochs: int, **extra) -> dict:
    host0 = records["m0"]
    t = measure.throughput(host0)
    return {"case": case, "variant": variant, "members": args.members, "epochs": epochs, "steps": len(host0["steps"]),
            "seconds": round(t["seconds"], 1), "samples_per_s": round(t["samples_per_s"], 2),
            "mean_members": round(t["mean_members"], 3), "per_member_samples_per_s": round(t["per_member"], 2),
            "step_time_median_s": round(measure.step_time(host0), 4),
            "ledger": measure.ledger_check(host0, args.num_samples, epochs), **extra}


def with_target(r: dict, metric: str, value, case: str, better: str) -> dict:
    target = TARGETS[case]
    met = "" if value is None else ("yes" if (value >= target if better == "high" else value <= target) else "no")
    r.update(metric=metric, value="" if value is None else round(value, 3),
             target=f"{'>=' if better == 'high' else '<='} {target}", met=met)
    return r


def run_cases(args, out: Path):
    rows, curves = [], {}
    steady = None
    if "steady" in args.cases:
        for variant, elastic in (("elastic", True), ("plain DDP", False)):
            records = run_plain(args, out / f"steady-{variant.split()[0]}", args.steady_epochs, elastic=elastic)
            r = row("steady", variant, records, args, args.steady_epochs)
            rows.append(r)
            curves[f"steady {variant}"] = measure.series(records["m0"])
        steady, plain = rows[0], rows[1]
        r = measure.ratio(steady["step_time_median_s"], plain["step_time_median_s"])
        steady.update(metric="step time / plain DDP's", value=round(r, 3), target="~1", met="")
    if "churn" in args.cases:
        records, leaves, joins = run_churn(args, out / "churn")
        r = row("churn", f"leave every {args.leave_every:g} s, back {args.back_after:g} s", records, args,
                args.churn_epochs, leaves=leaves, joins=joins)
        h = measure.heals(records)
        r["heal_s"] = round(max(x["heal_s"] for x in h), 3) if h else ""
        base = measure.ratio(r["per_member_samples_per_s"], steady and steady["per_member_samples_per_s"])
        rows.append(with_target(r, "per-member samples/s / steady's", base, "churn", "high"))
        curves["churn"] = measure.series(records["m0"])
    if "join" in args.cases:
        records = run_join(args, out / "join")
        h = measure.heals(records)[0]
        r = row("join", f"{args.members - 1} + 1 joiner", records, args, args.epochs, joins=1,
                heal_s=round(h["heal_s"], 3), state_bytes=h["state_bytes"],
                heal_bytes_per_s=round(h["state_bytes"] / h["heal_s"]))
        link_s = h["state_bytes"] * 8 / (args.link_rate * 1e9) if args.link_rate else None
        rows.append(with_target(r, "heal / transfer at the link", measure.ratio(h["heal_s"], link_s), "join", "low"))
        curves["join"] = measure.series(records["m0"])
    if "mixed" in args.cases:
        slow = {f"m{args.members - 2}": args.slow_factor, f"m{args.members - 1}": args.slow_factor}
        runs = {pace: run_plain(args, out / f"mixed-pace-{'on' if pace else 'off'}", args.epochs, pace=pace, slow=slow)
                for pace in (False, True)}
        rates = measure.own_rates(runs[False])  # each member's own rate at an equal share
        total = sum(rates.values()) if len(rates) == args.members else None
        for pace in (True, False):
            name = f"mixed pacing {'on' if pace else 'off'}"
            r = row("mixed", f"2 of {args.members} at 1/{args.slow_factor:g} speed, pacing {'on' if pace else 'off'}",
                    runs[pace], args, args.epochs, own_rates_sum=round(total or 0, 2),
                    own_rates=" ".join(f"{n}:{v:.1f}" for n, v in sorted(rates.items())))
            rows.append(with_target(r, "samples/s / sum of own rates", measure.ratio(r["samples_per_s"], total),
                                    "mixed", "high"))
            curves[name] = measure.series(runs[pace]["m0"])
    return rows, curves


COLUMNS = ("case", "variant", "samples_per_s", "mean_members", "per_member_samples_per_s", "step_time_median_s",
           "heal_s", "state_bytes", "metric", "value", "target", "met", "ledger")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out or report.default_out_dir("churn"))
    out.mkdir(parents=True, exist_ok=True)
    where = f"{args.members} members on this machine over loopback ({args.device}), model {args.model}"
    header = report.machine_header(sys.argv[1:] if argv is None else argv, where, {
        "emulated compute": f"{args.sample_s:g} s per sample; slow members x{args.slow_factor:g}",
        "data": f"{args.num_samples} samples per epoch, global batch {args.global_batch}"})
    rows, curves = run_cases(args, out)
    report.write_csv(str(out / "results.csv"), rows)
    table = (list(COLUMNS), [[str(r.get(c, "")) for c in COLUMNS] for r in rows])
    notes = ["samples/s: the committed samples after host 0's first 2 steps, over that time; mean_members: "
             "time-weighted; heal_s: from the boundary that admits a joiner to its first step (churn: the "
             "longest); ledger: every id of every epoch trained exactly once"]
    report.print_table("churn, join and mixed speeds", table, notes)
    (out / "results.md").write_text(report.markdown("Elastic churn benchmark", header, table, notes))
    why = report.plot(str(out / "results.png"), "elastic: committed samples/s and members over time", [
        {"xlabel": "s since warm-up", "ylabel": "committed samples/s (5-step mean)",
         "series": {k: v["samples"] for k, v in curves.items()}},
        {"xlabel": "s since warm-up", "ylabel": "members",
         "series": {k: v["members"] for k, v in curves.items()}}])
    if why:
        print(why, file=sys.stderr)
    print(f"wrote {out}/results.csv, results.md, results.png")
    bad = [f"{r['case']} ({r['variant']}): {r['ledger']}" for r in rows if r["ledger"] != "ok"]
    if bad:
        print("ledger check failed: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
