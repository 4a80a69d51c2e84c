"""One member of the elastic tests' job: linear regression in torch's DDP over the elastic group.

Started by elastic_launch.py as a launched member (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or as a joiner
(ELASTIC_JOIN=1). It writes <ELASTIC_OUT>/<member>.json when training ends: its final weights and momentum, the
steps it committed (each with its epoch and the global batch's ids), the ledger of each epoch it finished, and
when each step boundary was decided; a member that fails writes <out>/failed-<pid> (the time) first. Scenario
variables:

- ELASTIC_PAUSE_MEMBER, ELASTIC_PAUSE_AT: that member, at that step (committed steps before it), writes
  <out>/paused and waits in the middle of its step (before its backward) until <out>/go exists or it was
  asked to leave; the others wait in the step's allreduce meanwhile;
- ELASTIC_STEP_SLEEP: seconds every step sleeps (a slower job);
- ELASTIC_SAMPLE_S, ELASTIC_SLOW_MEMBER, ELASTIC_SLOW_FROM: every member's step sleeps ELASTIC_SAMPLE_S per
  sample it was dealt (its compute), that member's twice as long from that step on (default 0): a Mac that drops
  to half the others' speed;
- ELASTIC_PACE=0: equal shares (ElasticSettings.pace=False);
- ELASTIC_GLOBAL_BATCH, ELASTIC_EPOCHS: other than GLOBAL_BATCH and EPOCHS;
- ELASTIC_ENGINE_HEARTBEAT_S: the elastic group's engine heartbeat timeout (default 10 s);
- ELASTIC_AWAIT_JOIN_AT: at that step, every launched member writes <out>/awaiting-join and waits until the
  joiner j1 has posted at the step's boundary (so it is admitted there, and trains from the next step on);
- ELASTIC_HOLD_AT: at that step, every launched member writes <out>/holding and waits (before any collective)
  until <out>/go exists;
- ELASTIC_CONSOLE: a path; <path>.<RANK> holds who is logged in at that launched member's screen (no file:
  nobody), read in place of `stat /dev/console` with ElasticSettings(leave_when_owner_logs_in=True,
  owner_poll_s=0.05);
- ELASTIC_MODEL_INPUTS: the model's input width (default the data's, 6): another width is another model, and a
  joiner with it is refused; ELASTIC_LR: the learning rate, part of the config every member passes (another is
  another config, refused too).

SIGUSR1 dumps every thread's Python stack to the output (the launcher's report of a member that hangs).
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.parallel  # noqa: F401  (DDP's imports, before the job starts)

from lightning_mccl.elastic import ElasticManager, ElasticSampler, ElasticSettings, elastic_ddp

NUM_SAMPLES, FEATURES, GLOBAL_BATCH, EPOCHS = 96, 6, 8, 3
LR, MOMENTUM, DATA_SEED, SAMPLER_SEED = 0.05, 0.9, 1234, 7
SETTINGS = ElasticSettings(timeout=40.0, heartbeat_s=0.1, silent_after_s=3.0, suspect_grace_s=0.5,
                           engine_heartbeat_s=float(os.environ.get("ELASTIC_ENGINE_HEARTBEAT_S", "10")),
                           pace=os.environ.get("ELASTIC_PACE", "1") == "1")
WAIT_S = 60.0  # the longest a paused member waits


def dataset():
    g = np.random.default_rng(DATA_SEED)
    x = g.standard_normal((NUM_SAMPLES, FEATURES))
    y = x @ g.standard_normal(FEATURES) + 0.1 * g.standard_normal(NUM_SAMPLES)
    return x, y


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the test's scenario did not go on")
        time.sleep(0.02)


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    out = Path(os.environ["ELASTIC_OUT"])
    pause_member = os.environ.get("ELASTIC_PAUSE_MEMBER", "")
    pause_at = int(os.environ.get("ELASTIC_PAUSE_AT", "-1"))
    await_join_at = int(os.environ.get("ELASTIC_AWAIT_JOIN_AT", "-1"))
    step_sleep = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))
    hold_at = int(os.environ.get("ELASTIC_HOLD_AT", "-1"))
    lr = float(os.environ.get("ELASTIC_LR", str(LR)))
    sample_s = float(os.environ.get("ELASTIC_SAMPLE_S", "0"))
    slow_member = os.environ.get("ELASTIC_SLOW_MEMBER", "")
    slow_from = int(os.environ.get("ELASTIC_SLOW_FROM", "0"))
    global_batch = int(os.environ.get("ELASTIC_GLOBAL_BATCH", str(GLOBAL_BATCH)))
    epochs = int(os.environ.get("ELASTIC_EPOCHS", str(EPOCHS)))
    x, y = dataset()
    inputs, targets = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    torch.manual_seed(int(os.environ.get("RANK", "99")))  # different on every member: host 0's state wins
    model = torch.nn.Linear(int(os.environ.get("ELASTIC_MODEL_INPUTS", str(FEATURES))), 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)

    def load(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    console = Path(f"{os.environ.get('ELASTIC_CONSOLE')}.{os.environ.get('RANK')}")
    login = {} if "ELASTIC_CONSOLE" not in os.environ else {
        "settings": replace(SETTINGS, leave_when_owner_logs_in=True, owner_poll_s=0.05),
        "console_user": lambda: console.read_text().strip() if console.exists() else ""}
    manager = ElasticManager.from_env(
        ElasticSampler(NUM_SAMPLES, global_batch, seed=SAMPLER_SEED),
        state_dict=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        load_state_dict=load, join=os.environ.get("ELASTIC_JOIN") == "1", **{"settings": SETTINGS, **login},
        config={"lr": lr, "momentum": MOMENTUM, "global_batch": global_batch, "sampler_seed": SAMPLER_SEED})
    record = {"commits": [], "ledgers": {}, "boundaries": [], "first_step": None, "initial": None}
    ddp = None
    while manager.epoch < epochs:
        step = manager.start_step()
        if step is None:
            break
        if ddp is None:
            record["first_step"] = step.index
            record["initial"] = [p.detach().double().flatten().tolist() for p in model.parameters()]
            ddp = elastic_ddp(model, manager)
        record["boundaries"].append({"start": time.time(), "step": step.index, "size": step.size,
                                     "shares": {m: len(ids) for m, ids in step.deal.slices.items()}})
        if manager.me == pause_member and step.index == pause_at and not (out / "paused").exists():
            (out / "paused").write_text(str(time.time()))
            wait_until(lambda: (out / "go").exists() or manager.leave_requested)
        if manager.me.startswith("m") and step.index == await_join_at and "awaited" not in record:
            record["awaited"] = True  # until j1 posted at this step's boundary (once: the step may be redone)
            (out / "awaiting-join").write_text(str(time.time()))
            wait_until(lambda: manager.board.has([f"round/{manager.membership.round}/post/j1"]))
        if manager.me.startswith("m") and step.index == hold_at and "held" not in record:
            record["held"] = True
            (out / "holding").write_text(str(time.time()))
            wait_until(lambda: (out / "go").exists())
        slow = manager.me == slow_member and step.index >= slow_from
        time.sleep(step_sleep + sample_s * len(step.ids) * (2 if slow else 1))
        ids = torch.as_tensor(step.ids)
        loss = ((ddp(inputs[ids]).squeeze(1) - targets[ids]) ** 2).sum() / max(len(ids), 1)
        loss.backward()
        committed = manager.should_commit()
        record["boundaries"][-1].update(end=time.time(), committed=committed, reason=manager.decision.reason,
                                        members=list(manager.decision.members))
        if committed:
            optimizer.step()
            record["commits"].append([step.index, step.epoch, step.deal.ids.tolist()])
        optimizer.zero_grad()
        if manager.sampler.epoch_done:
            record["ledgers"][str(manager.sampler.epoch)] = manager.sampler.ledger().tolist()
    record["trained_at"] = time.time()
    manager.finish()
    record.update(finished_at=time.time(), member=manager.me, left=manager.left, steps=manager.step,
                  **final_state(model, optimizer))
    (out / f"{manager.me}.json").write_text(json.dumps(record))
    return 0


def final_state(model, optimizer) -> dict:
    """The weights and SGD's momentum buffers as lists of float64 (what the tests compare bit for bit)."""
    return {"weights": [p.detach().double().flatten().tolist() for p in model.parameters()],
            "momentum": [optimizer.state[p]["momentum_buffer"].double().flatten().tolist()
                         for p in model.parameters() if p in optimizer.state]}


def run(main) -> None:
    """Exits with main()'s code; a member that fails writes <ELASTIC_OUT>/failed-<pid> (the time) first."""
    try:
        sys.exit(main())
    except Exception:
        (Path(os.environ["ELASTIC_OUT"]) / f"failed-{os.getpid()}").write_text(str(time.time()))
        raise


if __name__ == "__main__":
    run(main)
