"""The report of benchmarks/fleet_ddp.py: the table on stdout, results.csv, results.md, results.png."""
from __future__ import annotations

import os

from . import report


def _ms(x) -> str:
    return f"{x * 1e3:.0f}" if x != "" and x is not None else ""


def table(rows: list, baseline: str) -> report.Table:
    cols = ["ranks", "batch", "series", "step ms", "min", "max", "samples/s", f"vs {baseline}",
            "efficiency", "exposed comm ms", "wire ms fp32 / 16-bit", "weights vs ref"]
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([str(r["world"]), str(r["batch_per_rank"]), r["series"], "FAILED"] + [""] * 8)
            continue
        ratio, eff = r.get(f"vs_{baseline}", ""), r.get("efficiency", "")
        wire = f"{_ms(r['wire_fp32_s'])} / {_ms(r['wire_16bit_s'])}" if r.get("wire_fp32_s") != "" else ""
        same = f"{r['weights_match']} ({r['weights_rel_diff']:.1e})" if "weights_match" in r else \
            ("ref" if r["backend"] != "none" else "")
        step = r.get("step_s", r["time_median_s"])  # DiLoCo: the mean per inner step over whole rounds
        cells.append([str(r["world"]), str(r["batch_per_rank"]), r["series"], _ms(step),
                      _ms(r["time_min_s"]), _ms(r["time_max_s"]), f"{r['samples_per_s']:.1f}",
                      f"{ratio:.2f}x" if ratio != "" else "", f"{eff:.2f}" if eff != "" else "",
                      _ms(r.get("exposed_comm_s", "")) if r["backend"] != "none" else "", wire, same])
    return cols, cells


def timeline_table(rows: list) -> report.Table:
    """The mccl series' steps split by the engine's timeline (ddp_timeline.py)."""
    cols = ["ranks", "batch", "series", "step ms", "collectives", "before first", "held", "staging", "peers",
            "engine", "starved", "after last", "ring ms at the link", "(peers + engine) / ring"]
    cells = []
    for r in rows:
        if "tl_engine" not in r:
            continue
        ring = r.get("tl_ring_s", "")
        step = r.get("step_s", r["time_median_s"])  # DiLoCo: the mean per inner step over whole rounds
        cells.append([str(r["world"]), str(r["batch_per_rank"]), r["series"], _ms(step),
                      f"{r['tl_collectives']:.0f}"] +
                     [_ms(r[f"tl_{p}"]) for p in ("before_first", "held", "staging", "peers", "engine", "starved",
                                                  "after_last")] +
                     [_ms(ring), f"{(r['tl_peers'] + r['tl_engine']) / ring:.2f}" if ring else ""])
    return cols, cells


TIMELINE_NOTES = [
    "From the engine's timeline (lightning_mccl.timeline()), each part the median over the timed steps of the "
    "mean over the ranks, in ms: before first = step start to the first collective's issue (forward, backward up "
    "to the first bucket); held = issued (or the previous one done) to started (the completion order waits for "
    "the previous future's callbacks); staging = started to ready (device-to-host copies); peers = ready to the "
    "last rank's ready (waiting for a peer's bucket; the stand-in's ranks share a clock); engine = the rest of "
    "ready to done; starved = no collective issued yet; after last = the last collective done to the "
    "step's end. ring ms = 2(n-1)/n x the collectives' bytes / link TCP goodput."]

NOTES = [
    "step: barrier, then zero_grad + forward + backward (DDP's allreduce overlapping it) + SGD step + device "
    "synchronize; the slowest rank's time; median (min, max) over the timed steps; for DiLoCo (+diloco:H=..) the "
    "mean per inner step over the whole rounds among them (the outer allreduce's start and apply included). "
    "samples/s = ranks x batch / step. efficiency = the compute-only step (same processes, no DDP) / this step; "
    "exposed comm = step - compute. wire = the ring allreduce's time on the wire for the step's float32 gradients, "
    "2(n-1)/n x bytes / link TCP goodput, and for 16-bit gradients (blank on loopback). weights vs ref: "
    "|w - w_ref| / |w_ref - w_start| at the end (tolerance 1e-3 exact, 5e-2 with 16-bit gradients; PowerSGD "
    "and DiLoCo train differently by design)."]


def write_outputs(out: str, rows: list, header: dict, baseline: str, log, quiet: bool = False) -> None:
    cols, cells = table(rows, baseline)
    model = next((r["model"] for r in rows if "model" in r), "")
    title = f"DDP training step on a fleet stand-in, {model}"
    report.write_csv(os.path.join(out, "results.csv"), rows)
    timeline = timeline_table(rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown(title, header, (cols, cells), NOTES))
        if timeline[1]:
            f.write("\n## Where the mccl steps go\n\n" + report.markdown_table(timeline, TIMELINE_NOTES))
    ok = [r for r in rows if "error" not in r]
    configs = list(dict.fromkeys((r["world"], r["batch_per_rank"]) for r in ok))
    ticks = (list(range(len(configs))), [f"{n} x b{b}" for n, b in configs])
    labels = list(dict.fromkeys(r["series"] for r in ok))

    def line(label, key):
        rs = [r for r in ok if r["series"] == label and r.get(key, "") != ""]
        return [configs.index((r["world"], r["batch_per_rank"])) for r in rs], [r[key] for r in rs]

    panels = [{"ylabel": "samples/s", "xlabel": "ranks x batch per rank", "xticks": ticks,
               "series": {lab: line(lab, "samples_per_s") for lab in labels}},
              {"ylabel": "efficiency (compute step / step)", "xlabel": "ranks x batch per rank", "xticks": ticks,
               "series": {lab: line(lab, "efficiency") for lab in labels if lab != "compute"}}]
    why = report.plot(os.path.join(out, "results.png"), f"{title}: {header['where']}", panels)
    if quiet:
        return
    if why:
        log(why)
    report.print_table(f"{title} ({header['where']})", (cols, cells), NOTES)
    if timeline[1]:
        report.print_table("Where the mccl steps go", timeline, TIMELINE_NOTES)
    log(f"wrote {out}/results.csv, results.md{'' if why else ', results.png'}")
