"""`mccl plan`'s accuracy rows, below the speed of each fleet size: what each method cost in accuracy on the
project's benchmark task (accuracy_costs.py holds the measurements), and its time to DDP's accuracy on the
largest fleet planned where the record allows an estimate (the steps the method needed to reach DDP's accuracy,
as a multiple of DDP's, times its predicted step), else why not."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .. import accuracy_costs
from ..accuracy_costs import DILOCO as DILOCO_SYNC, Mode
from ..wire_policy import BF16 as BF16_WIRE, FLOAT32, INT8, POWERSGD
from .methods import BF16, DDP, DILOCO, Int8, PowerSGD
from .predict import Prediction, Settings

COST_ROW, TIME_ROW = "accuracy*", "time to accuracy*"
KEY = (f"{COST_ROW}: final validation accuracy against float32 DDP, in points (± as the record gives it), measured "
       f"on {accuracy_costs.TASK}, not on your model: {accuracy_costs.CONVERGENCE}, {accuracy_costs.DILOCO_SWEEP}")


def mode(method: str, s: Settings) -> Mode:
    """The communication mode a plan's method stands for, with the plan's settings."""
    return {DDP.name: Mode(), BF16.name: Mode(compress=BF16_WIRE), Int8.name: Mode(compress=INT8),
            PowerSGD.name: Mode(compress=POWERSGD, powersgd_rank=s.powersgd_rank),
            DILOCO: Mode(DILOCO_SYNC, None if s.diloco_wire == FLOAT32 else s.diloco_wire,
                         sync_every=s.sync_every, sync_delay=s.sync_delay, fragments=s.fragments)}[method]


def time_key(hosts: int) -> str:
    return (f"{TIME_ROW}: the time to reach DDP's accuracy on {hosts} hosts, as a multiple of DDP's: the steps the "
            f"method needed for it on the benchmark task (as many as DDP's where its curve followed DDP's) times its "
            f"step here; '-' where the record does not have them (said below)")


def _cost_cell(m: Mode) -> str:
    found = accuracy_costs.costs(m)
    if found is None:
        return "not measured"
    if not found:
        return "reference"
    if len(found) == 1:
        return found[0].text().removesuffix(" points")
    return ", ".join(f"{c.text().removesuffix(' points')} ({c.steps} steps)" for c in found)


def rows(methods: Sequence[str], s: Settings, hosts: int, steps: Dict[str, float]) -> Tuple[List[List[str]], List[str]]:
    """(the table's accuracy rows, notes saying why a method has no time to DDP's accuracy). `steps`: each
    method's predicted step on `hosts`, the largest fleet planned, DDP's included."""
    costs, times, notes = [COST_ROW], [TIME_ROW], []
    for name in methods:
        m = mode(name, s)
        costs.append(_cost_cell(m))
        factor, why = accuracy_costs.steps_to_reference(m)
        if factor is None:
            times.append("-")
            notes.append(f"{name}: no time to accuracy: {why}")
        else:
            times.append(f"{factor * steps[name] / steps[DDP.name]:.2f}x")
    return [costs, times], notes


def largest_fleet(predictions: Sequence[Prediction], ddp: Sequence[Prediction]) -> Tuple[int, Dict[str, float]]:
    """For `rows`: the largest fleet planned, and the step of every method (and of DDP, from `ddp`) on it."""
    hosts = max(p.hosts for p in predictions)
    return hosts, {p.method: p.step_s for p in (*predictions, *ddp) if p.hosts == hosts}
