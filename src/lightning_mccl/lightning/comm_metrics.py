"""`CommMetrics`: the fleet's communication in the Trainer's loggers, and the straggler report.

On by default in `MCCLStrategy` (`comm_metrics=False` turns it off; `comm_metrics=CommMetrics(...)` tunes
it). Every `every_n_steps` training steps (default: the Trainer's `log_every_n_steps`) it logs, to every
logger of the Trainer (CSV, TensorBoard, W&B, ...; rank 0's numbers, as for any Lightning metric):

    comm/bytes_per_step               payload bytes this rank sent per step (after compression)
    comm/wire_goodput_gbps            those bytes over the time the engine was busy with them, in Gbit/s
    comm/time_per_step_s              time collectives were in flight per step (overlapped or not)
    comm/exposed_fraction             the part of the step the training loop waited for communication
    comm/step_time_s                  this rank's mean step time
    comm/step_time_max_over_ranks_s   the slowest rank's mean step time (what the fleet runs at)
    comm/straggler_factor             the slowest rank's compute time per step over the median rank's

Measured per step, on each rank: the step's wall time (on_train_batch_start to on_train_batch_end); the
exposed time, which is the longer of the time callers were blocked in a blocking collective and the tail
of the step's last collective (from its issue to its completion: for DDP, the bucket issued when the
backward pass ended, after which the loop only waits); compute is the rest. The counters come from the
engine (`lightning_mccl.stats`) and cost nothing to keep; every N steps the ranks exchange one small
tensor (their window's means and samples/s), which is also what the straggler report works on. That
exchange itself is left out of the next window's counters.

Under `MCCLStrategy(sync="diloco")` the counters are the outer group's (`strategy.outer_group`: the steps run
no collective of their own), and the exposed time is the time the loop waited for an outer sync only: that
allreduce runs across the steps that follow it, so its span is not the step's tail.

Under the elastic strategies (`MCCLElasticStrategy`, `MCCLElasticDiLoCoStrategy`) the members change while the
fit runs, so it logs what the step boundaries decided instead, every N steps, from the latest decision (the same
on every member; no exchange): `comm/members` (how many trained the step), and per member id `comm/share/<id>`
(its samples of the global batch, or of the round's) and `comm/samples_per_s/<id>` (the measured rate its share
follows, 0 while not measured yet; docs/elastic.md, *Pace by speed*).

At the end of fit rank 0 prints the per-host table (straggler.py) and one line: the communication share
of the step time, the exposed share, goodput and bytes per step; then the strategy's communication mode
(`compress`, DDP or DiLoCo, H) and what it cost in accuracy on the project's benchmark task (accuracy_costs.py).
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Union

import torch
import torch.distributed as dist

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.data import extract_batch_size

from ..counters import mccl_backend, totals
from ..rendezvous import launcher_hosts
from ..straggler import (DEFAULT_PATIENCE, DEFAULT_THRESHOLD, SUMMARY_MARKER_ENV, RankWindow, StragglerReport,
                         summary_text)

PREFIX = "comm/"
HOST_BYTES = 64

# torch 2.14 renamed all_gather_into_tensor (now deprecated) to all_gather_single
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CommMetrics(Callback):
    """See the module docstring. every_n_steps: None for the Trainer's log_every_n_steps.
    straggler_threshold / straggler_patience: a rank more than this fraction above the median compute time
    for this many windows in a row is reported. summary: print the table and line at the end of fit."""

    def __init__(self, every_n_steps: Optional[int] = None, straggler_threshold: float = DEFAULT_THRESHOLD,
                 straggler_patience: int = DEFAULT_PATIENCE, summary: bool = True) -> None:
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or every_n_steps < 1):
            raise ValueError(f"CommMetrics(every_n_steps={every_n_steps!r}): expected a positive int or None")
        self.every_n_steps = every_n_steps
        self.summary = summary
        self.report = StragglerReport(threshold=straggler_threshold, patience=straggler_patience)
        self.history: List[Dict[str, float]] = []  # every logged dict, on every rank
        self.hosts: List[str] = []
        self._backend = None
        self._overlapped = False  # the outer group of sync="diloco"
        self._mode: Optional[dict] = None  # the strategy's comm_mode(), for the summary
        self._manager = None  # an elastic strategy's ElasticManager

    # -- hooks -------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        outer = getattr(trainer.strategy, "outer_group", None)  # sync="diloco"
        self._backend, self._overlapped = mccl_backend(outer), outer is not None
        comm_mode = getattr(trainer.strategy, "comm_mode", None)  # the mccl strategies'
        self._mode = asdict(comm_mode()) if callable(comm_mode) else None
        self._manager = getattr(trainer.strategy, "manager", None)  # the elastic strategies'
        if self._manager is not None:
            self._n, self._steps = self.every_n_steps or max(1, trainer.log_every_n_steps), 0
            return
        if self._backend is None:
            return  # not on mccl (e.g. process_group_backend="gloo"): nothing to count
        self._n = self.every_n_steps or max(1, trainer.log_every_n_steps)
        self.report.steps_per_window = self._n
        self.hosts = self._gather_hosts()
        self._begin_window()

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        if self._backend is not None:
            self._step_start = time.perf_counter()
            self._step_counters = self._backend.stats()

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._manager is not None:
            self._steps += 1
            if self._steps % self._n == 0:
                self._log_shares(trainer)
            return
        if self._backend is None:
            return
        step_s = time.perf_counter() - self._step_start
        before, after = self._step_counters, self._backend.stats()
        waited_s = (totals(after)["wait_ns"] - totals(before)["wait_ns"]) / 1e9
        tail_s = 0.0
        if after["last_done_ns"] != before["last_done_ns"] and not self._overlapped:  # one completed in this step
            tail_s = max(0, after["last_done_ns"] - after["last_issued_ns"]) / 1e9
        exposed = min(step_s, max(waited_s, tail_s))
        self._steps += 1
        self._step_s += step_s
        self._exposed_s += exposed
        try:
            self._samples += extract_batch_size(batch)
        except Exception:  # noqa: BLE001 - a batch Lightning cannot size: samples/s stays unknown (0)
            pass
        if self._steps >= self._n:
            self._end_window(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._backend is None:
            return
        if self.summary and trainer.global_rank == 0 and self.report.windows:
            text = self.summary_text()
            print(text, flush=True)
            marker = os.environ.get(SUMMARY_MARKER_ENV)
            if marker:
                print(f"{marker} {json.dumps(self.summary_record())}", flush=True)

    # -- windows -----------------------------------------------------------------------------------------

    def _begin_window(self) -> None:
        self._window_counters = totals(self._backend.stats())
        self._window_start = time.perf_counter()
        self._steps, self._step_s, self._exposed_s, self._samples = 0, 0.0, 0.0, 0

    def _end_window(self, trainer: "pl.Trainer") -> None:
        now = totals(self._backend.stats())
        sent = now["bytes_sent"] - self._window_counters["bytes_sent"]
        busy_ns = now["busy_ns"] - self._window_counters["busy_ns"]
        steps = self._steps
        step_s = self._step_s / steps
        exposed_s = self._exposed_s / steps
        samples_per_s = self._samples / self._step_s if self._step_s > 0 else 0.0
        windows = self._gather([step_s, step_s - exposed_s, exposed_s, samples_per_s])
        median_compute = sorted(w.compute_s for w in windows)[len(windows) // 2]
        metrics = {
            "bytes_per_step": sent / steps,
            "wire_goodput_gbps": sent * 8 / busy_ns if busy_ns > 0 else 0.0,
            "time_per_step_s": busy_ns / 1e9 / steps,
            "exposed_fraction": self._exposed_s / self._step_s if self._step_s > 0 else 0.0,
            "step_time_s": step_s,
            "step_time_max_over_ranks_s": max(w.step_s for w in windows),
            "straggler_factor": max(w.compute_s for w in windows) / median_compute if median_compute > 0 else 1.0,
        }
        self.history.append(metrics)
        for message in self.report.add(windows):
            rank_zero_warn(message)
        logged = {PREFIX + k: v for k, v in metrics.items()}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=trainer.global_step)
        self._begin_window()  # after the exchange: its own traffic is not counted

    def _log_shares(self, trainer: "pl.Trainer") -> None:
        """The latest step boundary's membership, shares and rates (the elastic strategies)."""
        decision = self._manager.decision
        if decision is None or not decision.shares:
            return
        logged: Dict[str, float] = {PREFIX + "members": float(len(decision.members))}
        rates = decision.rates or (0.0,) * len(decision.members)
        for member, share, rate in zip(decision.members, decision.shares, rates):
            logged[f"{PREFIX}share/{member}"] = float(share)
            logged[f"{PREFIX}samples_per_s/{member}"] = float(rate)
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=trainer.global_step)

    def _gather(self, values: List[float]) -> List[RankWindow]:
        mine = torch.tensor(values, dtype=torch.float64)
        everyone = torch.empty(dist.get_world_size() * len(values), dtype=torch.float64)
        _all_gather(everyone, mine)
        rows = everyone.view(dist.get_world_size(), len(values)).tolist()
        return [RankWindow(r, self.hosts[r], *row) for r, row in enumerate(rows)]

    def _gather_hosts(self) -> List[str]:
        name = socket.gethostname().encode()[:HOST_BYTES]
        mine = torch.zeros(HOST_BYTES, dtype=torch.uint8)
        mine[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
        everyone = torch.empty(dist.get_world_size() * HOST_BYTES, dtype=torch.uint8)
        _all_gather(everyone, mine)
        rows = everyone.view(-1, HOST_BYTES).tolist()
        # The launcher's names (h0, h1, ... under --switch, the hostfile's under --hostfile) where it set them:
        # the summary then says what the launcher says. The gather above runs either way (a collective).
        launched = launcher_hosts(dist.get_world_size())
        return launched or [bytes(b for b in row if b).decode(errors="replace") for row in rows]

    # -- the end-of-fit summary --------------------------------------------------------------------------

    def totals(self) -> Dict[str, float]:
        """Means over every logged window of this rank's metrics."""
        keys = self.history[0].keys() if self.history else ()
        return {k: sum(h[k] for h in self.history) / len(self.history) for k in keys}

    def summary_record(self) -> dict:
        return {"metrics": self.totals(), "hosts": self.report.host_table(), "slowest": self.report.slowest_rank(),
                "proposal": self.report.proposal(),
                "world_size": len(self.hosts), "mode": self._mode}

    def summary_text(self) -> str:
        return summary_text(self.summary_record())


def comm_metrics_option(option: Union[bool, CommMetrics]) -> Union[bool, CommMetrics]:
    """`option` if it is an MCCLStrategy `comm_metrics` value (True, False or a CommMetrics), else ValueError
    naming it (0, "no" or None do not mean off)."""
    if isinstance(option, (bool, CommMetrics)):
        return option
    raise ValueError(f"MCCLStrategy(comm_metrics={option!r}): expected True, False or a CommMetrics(...) instance")


def attach(trainer: "pl.Trainer", option: Union[bool, CommMetrics]) -> None:
    """Adds the CommMetrics of an MCCLStrategy's `comm_metrics` option to a fitting Trainer (once; a
    CommMetrics the user gave the Trainer is kept instead)."""
    if comm_metrics_option(option) is False or trainer.state.fn != "fit":
        return
    if any(isinstance(c, CommMetrics) for c in trainer.callbacks):
        return
    trainer.callbacks.append(option if isinstance(option, CommMetrics) else CommMetrics())
