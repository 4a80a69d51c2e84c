"""One member of benchmarks/churn.py's job: AdamW on synthetic data, in torch's DDP over the elastic group
(ElasticManager), or in plain DDP over a ProcessGroupMCCL (elastic off, the no-regression row).

    python member.py SPEC.json      # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment;
                                    # CHURN_JOIN=1: a joiner; CHURN_GO=FILE: it joins once FILE exists

SPEC: model ("mlp": `width`, `depth`; else a timm model name), device, num_samples, global_batch, epochs,
elastic, pace, sample_s (seconds each sample sleeps: the emulated host's compute, on top of the model's),
slow (member -> factor: its sleep per sample, and its model's compute, that many times longer: a slower Mac),
warm_file_at (after that many committed steps host 0's member writes <out>/warm), await_joiner (then every
launched member waits, before its next step's work, until the joiner j1 posted at that step's boundary, so that
it is admitted there), out.

Writes <out>/training-<CHURN_NAME> at its first step, and <out>/<member>.json when it ends: each step's start
and end (and for host 0's member, the members and the committed ids), its first step's start, its measured
rate, the state's size as torch.save bytes, and for host 0's member each finished epoch's ledger.
"""
from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.parallel  # noqa: F401  (DDP's imports, before the job starts)

HOST_ZERO = "m0"


def build(spec: dict, device: torch.device):
    """(model, inputs(ids), targets(ids)): a deterministic synthetic data set indexed by sample id."""
    g = torch.Generator().manual_seed(1234)
    classes = 10
    if spec["model"] == "mlp":
        width, depth, features = spec["width"], spec["depth"], 64
        layers = [nn.Linear(features, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(width, classes))
        x = torch.randn(spec["num_samples"], features, generator=g)
    else:
        import timm

        model = timm.create_model(spec["model"], num_classes=classes)
        bank = 32  # distinct images; sample i is image i mod bank
        x = torch.randn(bank, 3, 224, 224, generator=g)
    y = torch.randint(0, classes, (spec["num_samples"],), generator=g)
    x, y = x.to(device), y.to(device)
    return model.to(device), (lambda ids: x[torch.as_tensor(ids) % len(x)]), (lambda ids: y[torch.as_tensor(ids)])


def state_bytes(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.tell()


def compute(spec: dict, ddp, x, y, n: int, factor: float, device) -> None:
    """The step's work: the emulated host's sleep per sample, forward and backward; a slower member's forward
    and backward are followed by a sleep of (factor - 1) times their duration."""
    time.sleep(spec["sample_s"] * n * factor)
    t0 = time.perf_counter()
    out = ddp(x)
    loss = nn.functional.cross_entropy(out, y) if n else out.sum() * 0  # no samples: gradients that count for nothing
    loss.backward()
    if factor > 1:
        if device.type == "cuda":
            torch.cuda.synchronize()
        time.sleep((time.perf_counter() - t0) * (factor - 1))


def _await(condition, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark's scenario did not go on")
        time.sleep(0.02)


def elastic_run(spec: dict, model, inputs, targets, device, record: dict) -> str:
    from lightning_mccl.elastic import ElasticManager, ElasticSampler, ElasticSettings, elastic_ddp

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def load(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def user_state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    settings = ElasticSettings(timeout=120.0, pace=spec["pace"])
    manager = ElasticManager.from_env(ElasticSampler(spec["num_samples"], spec["global_batch"], seed=7),
                                      user_state, load, join=os.environ.get("CHURN_JOIN") == "1",
                                      settings=settings, config={k: spec[k] for k in ("model", "global_batch")})
    out, me = Path(spec["out"]), manager.me
    factor = float(spec["slow"].get(me, 1.0))
    ddp = None
    while manager.epoch < spec["epochs"]:
        step = manager.start_step()
        if step is None:
            break
        start = time.time()
        if ddp is None:
            record["first_step"] = start
            ddp = elastic_ddp(model, manager)
            (out / f"training-{os.environ['CHURN_NAME']}").write_text(me)
        if spec["await_joiner"] and me.startswith("m") and step.index == spec["warm_file_at"] \
                and "awaited" not in record:
            record["awaited"] = True  # once: the step may be redone
            _await(lambda: manager.board.has([f"round/{manager.membership.round}/post/j1"]))
        ids = step.ids
        compute(spec, ddp, inputs(ids), targets(ids), len(ids), factor, device)
        committed = manager.should_commit()
        row = {"start": start, "end": time.time(), "committed": committed, "n": len(ids)}
        if me == HOST_ZERO:
            row.update(members=list(manager.decision.members), size=step.size,
                       ids=step.deal.ids.tolist() if committed else [], epoch=step.epoch)
        record["steps"].append(row)
        if committed:
            optimizer.step()
        optimizer.zero_grad()
        if "state_bytes" not in record and manager.step >= 1:
            record["state_bytes"] = state_bytes({"user": user_state(), "manager": manager.state_dict()})
        if me == HOST_ZERO and manager.step == spec["warm_file_at"]:
            (out / "warm").write_text(str(time.time()))
        if me == HOST_ZERO and manager.sampler.epoch_done:
            record["ledgers"][str(manager.sampler.epoch)] = manager.sampler.ledger().tolist()
    record["rate"] = manager.speed.rate
    record["left"] = manager.left
    manager.finish()
    return me


def plain_run(spec: dict, model, inputs, targets, device, record: dict) -> str:
    """Synchronous DDP over a ProcessGroupMCCL: each rank its equal slice of the same global batches."""
    from datetime import timedelta

    import torch.distributed as dist

    import lightning_mccl  # noqa: F401  (registers the backend)

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    group = dist.new_group(backend="mccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    me = f"m{rank}"
    factor = float(spec["slow"].get(me, 1.0))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    per = spec["global_batch"] // world
    for epoch in range(spec["epochs"]):
        order = torch.randperm(spec["num_samples"], generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        for first in range(0, len(order) - spec["global_batch"] + 1, spec["global_batch"]):
            start = time.time()
            record.setdefault("first_step", start)
            ids = order[first + rank * per: first + (rank + 1) * per]
            compute(spec, ddp, inputs(ids), targets(ids), len(ids), factor, device)
            optimizer.step()
            optimizer.zero_grad()
            row = {"start": start, "end": time.time(), "committed": True, "n": len(ids)}
            if rank == 0:
                row.update(members=[f"m{r}" for r in range(world)], size=world, epoch=epoch,
                           ids=order[first:first + spec["global_batch"]])
            record["steps"].append(row)
    dist.destroy_process_group()
    return me


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device(spec["device"])
    torch.manual_seed(int(os.environ.get("RANK", "99")))  # host 0's state wins in the elastic job
    model, inputs, targets = build(spec, device)
    go = os.environ.get("CHURN_GO")  # a joiner started ahead (torch imported, its model built) waits for its cue
    if go:
        _await(lambda: Path(go).exists(), timeout=spec.get("timeout", 600.0))
    record = {"steps": [], "ledgers": {}}
    me = (elastic_run if spec["elastic"] else plain_run)(spec, model, inputs, targets, device, record)
    record["member"] = me
    (Path(spec["out"]) / f"{me}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
