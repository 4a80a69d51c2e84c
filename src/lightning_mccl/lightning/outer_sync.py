"""`MCCLStrategy(sync="diloco")`: the Lightning side of DiLoCo (the algorithm is `lightning_mccl.diloco`).

    trainer = Trainer(strategy=MCCLStrategy(sync="diloco", sync_every=4, compress="bf16"), num_nodes=24)

- **Arguments** (`settings`): `sync_every` counts training batches per round, so with `accumulate_grad_batches=k`
  a round is sync_every / k inner optimizer steps and k must divide it. `compress` is the pseudo-gradients' wire
  type: "bf16" or "fp16" (on the CPU the engine narrows them on the wire, accumulating in float32; on an
  accelerator they are cast on the device, `diloco.averaging_for`, as compress="bf16" does under DDP, so that the
  staging copies move half the bytes too), "int8" (the engine's
  8-bit allreduce with error feedback, docs/int8.md); None: float32 (unless MCCL_WIRE_DTYPE in the environment
  says otherwise, as for any group). Settings
  that belong to DDP (comm hooks, PowerSGD, buckets, unused parameters, ...) are errors naming them: the model
  is not wrapped in DDP at all, so no step allreduces a gradient.
- **The fit** (`OuterSync`): a dedicated group for the outer allreduce (the strategy's options plus the wire
  type in its pg_options; Lightning's own collectives stay on the default group, never queued behind it), a
  `DiLoCo` on the LightningModule after every optimizer step, every rank starting from rank 0's weights (or
  from its checkpoint), and at the end of fit the last round synced and every rank holding the anchor.
- **Checkpoints**: rank 0's file is an ordinary Lightning checkpoint (its weights and optimizer state) plus
  "diloco", the state every rank shares (anchor, outer momentum, position in the round, the average of a sync
  not yet applied), and "diloco_local", rank 0's own. Every other rank writes what is its own beside it,
  `<checkpoint>.rank<R>` (its weights, optimizer state and "diloco_local"), and reads it back on resume, so a
  run resumed mid-round continues exactly; `remove_checkpoint` removes them too.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import torch
import torch.distributed as dist

from .. import diloco
from . import compress as _compress

SYNC = ("ddp", "diloco")
WIRE = (None, "bf16", "fp16", "int8")  # compress under sync="diloco": the pseudo-gradients' wire type
EIGHT_BIT = "int8"  # not a group's wire type: the engine's 8-bit allreduce, called as such (diloco.Int8Mean)
DEFAULTS = {"outer_lr": diloco.OUTER_LR, "outer_momentum": diloco.OUTER_MOMENTUM, "sync_delay": 1}
SHARED, LOCAL = "diloco", "diloco_local"  # checkpoint keys
OWNER = "MCCLStrategy"


@dataclass(frozen=True)
class Settings:
    sync_every: int  # training batches per round
    outer_lr: float
    outer_momentum: float
    sync_delay: int
    wire: Optional[str]


def settings(sync: Any, sync_every: Any, outer: Dict[str, Any], compress: Optional[str], ddp_only: Dict[str, Any],
             uses_mccl: bool) -> Optional[Settings]:
    """The DiLoCo settings for sync="diloco", None for sync="ddp"; ValueError naming the setting for anything
    else. `outer`: outer_lr, outer_momentum, sync_delay as given; `ddp_only`: the DDP arguments given."""
    if sync not in SYNC:
        raise ValueError(f"{OWNER}(sync={sync!r}): expected one of {SYNC}")
    if sync == "ddp":
        given = {k: v for k, v in {"sync_every": sync_every, **outer}.items()
                 if v is not None and v != DEFAULTS.get(k)}
        if given:
            raise ValueError(f"{OWNER}({', '.join(f'{k}={v!r}' for k, v in given.items())}): these apply to "
                             f"sync='diloco' only")
        return None
    if sync_every is None:
        raise ValueError(f"{OWNER}(sync='diloco') needs sync_every=H, the training batches per round")
    diloco.check_settings(sync_every, outer["outer_lr"], outer["outer_momentum"], outer["sync_delay"], OWNER)
    if compress not in WIRE:
        raise ValueError(f"{OWNER}(sync='diloco', compress={compress!r}): DiLoCo has no DDP comm hooks; its "
                         f"pseudo-gradients travel as compress='bf16' or 'fp16' (the engine's wire type, summed in "
                         f"float32), 'int8' (the 8-bit allreduce with error feedback) or float32 (compress=None)")
    if compress is not None and not uses_mccl:
        raise ValueError(f"{OWNER}(sync='diloco', compress={compress!r}) needs process_group_backend='mccl' (the "
                         f"engine narrows the pseudo-gradients on the wire)")
    if ddp_only:
        raise ValueError(f"{OWNER}(sync='diloco', {', '.join(f'{k}={v!r}' for k, v in ddp_only.items())}): "
                         f"DDP settings, and sync='diloco' does not wrap the model in DDP")
    return Settings(sync_every, outer["outer_lr"], outer["outer_momentum"], outer["sync_delay"], compress)


def ddp_arguments_given(arguments: Dict[str, Any]) -> Dict[str, Any]:
    """Those of the strategy's DDP arguments (comm hooks, compress_options, DistributedDataParallel's keywords)
    that are not at their defaults (None, or DistributedDataParallel's own; LightningCLI passes every keyword)."""
    from torch.nn.parallel import DistributedDataParallel

    defaults = {name: p.default for name, p in inspect.signature(DistributedDataParallel).parameters.items()}
    defaults.update(find_unused_parameters=False, static_graph=False, gradient_as_bucket_view=False,
                    bucket_cap_mb=None)  # the strategy's defaults for these
    return {k: v for k, v in arguments.items() if v is not None and not (k in defaults and v == defaults[k])}


def check_trainer(config: Settings, trainer: Any, layer_sync: Any) -> int:
    """The inner optimizer steps per round for this Trainer; ValueError naming the Trainer setting that does not
    go with sync="diloco"."""
    k = trainer.accumulate_grad_batches
    if config.sync_every % k:
        raise ValueError(f"{OWNER}(sync='diloco', sync_every={config.sync_every}) with Trainer(accumulate_grad_"
                         f"batches={k}): a round must end on an optimizer step, so accumulate_grad_batches must "
                         f"divide sync_every")
    if config.sync_delay > config.sync_every // k:
        raise ValueError(f"{OWNER}(sync='diloco', sync_delay={config.sync_delay}): more than the "
                         f"{config.sync_every // k} optimizer steps of a round (sync_every={config.sync_every}, "
                         f"accumulate_grad_batches={k})")
    if layer_sync is not None:
        raise ValueError(f"{OWNER}(sync='diloco') with Trainer(sync_batchnorm=True): that synchronises every "
                         f"forward pass; DiLoCo averages the BatchNorm statistics at each outer sync instead")
    return config.sync_every // k


def check_optimizers(optimizers: list) -> None:
    """ValueError unless there is one optimizer: a round counts its steps."""
    if len(optimizers) != 1:
        raise ValueError(f"{OWNER}(sync='diloco') counts a round in the steps of one optimizer; this LightningModule "
                         f"has {len(optimizers)}")


class OuterSync:
    """DiLoCo for one fit of a LightningModule."""

    def __init__(self, config: Settings, module: Any, trainer: Any, layer_sync: Any, backend: str,
                 options: Mapping[str, str], resume: Optional[Mapping[str, Any]]) -> None:
        steps = check_trainer(config, trainer, layer_sync)
        eight_bit = config.wire == EIGHT_BIT
        wire = None if eight_bit else config.wire
        group_settings = {**options, **_compress.wire_settings(wire, None)} if backend == "mccl" else {}
        self.group = diloco.outer_group(group_settings, backend)
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        averaging = diloco.averaging_for(config.wire, self.group, device)
        self.diloco = diloco.DiLoCo(module, steps, outer_lr=config.outer_lr, outer_momentum=config.outer_momentum,
                                    sync_delay=config.sync_delay, averaging=averaging, owner=OWNER)
        if resume is not None:
            self.diloco.load_state_dict(resume)
        else:
            self.diloco.broadcast()

    def finish(self) -> None:
        self.diloco.finish()
        dist.destroy_process_group(self.group)

    def save(self, checkpoint: Dict[str, Any], rank: int) -> Optional[Dict[str, Any]]:
        """Adds the outer state to `checkpoint`; for ranks other than 0, returns what their own file holds."""
        state = self.diloco.state_dict()
        local = {key: state.pop(key) for key in diloco.LOCAL_KEYS}
        checkpoint[SHARED] = state
        if rank == 0:
            checkpoint[LOCAL] = local
            return None
        return {"state_dict": checkpoint["state_dict"], "optimizer_states": checkpoint.get("optimizer_states"),
                LOCAL: local}


def own_file(checkpoint_path: Any, rank: int) -> str:
    """Where rank `rank` (> 0) keeps its part of a DiLoCo checkpoint: beside it."""
    return f"{checkpoint_path}.rank{rank}"


def resume_state(checkpoint: Dict[str, Any], checkpoint_path: Any, rank: int, checkpoint_io: Any) -> Optional[dict]:
    """For a checkpoint that holds DiLoCo's state: this rank's weights and optimizer state put into `checkpoint`
    (from its own file, for ranks other than 0), and the DiLoCo state to resume from; None otherwise."""
    if SHARED not in checkpoint:
        return None
    if rank != 0:
        path = own_file(os.path.realpath(checkpoint_path), rank)  # beside the file a save_last="link" link names
        if not os.path.exists(path):
            raise ValueError(f"{OWNER}(sync='diloco'): {checkpoint_path} holds DiLoCo's shared state but rank "
                             f"{rank}'s own part, {path}, is missing (each rank writes its part beside the "
                             f"checkpoint, on its own disk)")
        checkpoint.update(checkpoint_io.load_checkpoint(path))
    return {**checkpoint[SHARED], **checkpoint[LOCAL]}
