"""DiLoCo for one Lightning fit (`MCCLDiLoCoStrategy`, diloco_strategy.py): the outer group, the `DiLoCo` object on
the inner optimizer's step hook, and where each rank keeps its part of a checkpoint.

- **The fit** (`OuterSync`): a dedicated group for the outer allreduce (the strategy's options plus the wire type
  in its pg_options; Lightning's own collectives stay on the default group, never queued behind it), a `DiLoCo`
  counting the inner optimizer's steps through its step post-hook, every rank starting from rank 0's weights (or
  from its checkpoint), and at the end of fit the last round synced and every rank holding the anchor.
- **Checkpoints**: rank 0's file is an ordinary Lightning checkpoint (its weights and optimizer state) plus
  "diloco", the state every rank shares (anchor, outer optimizer, position in the round, the average of a sync
  not yet applied), and "diloco_local", rank 0's own. Every other rank writes what is its own beside it,
  `<checkpoint>.rank<R>` (its weights, optimizer state and "diloco_local"), and reads it back on resume, so a
  run resumed mid-round continues exactly; `remove_checkpoint` removes them too. Checkpoints of the first
  releases' `MCCLStrategy(sync="diloco")` have the same layout and load (diloco/outer.py: DiLoCo.load_state_dict).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

import torch.distributed as dist

from ..diloco import averaging, outer
from ..wire_policy import Resolution
from .group import BACKEND, wire_settings

SHARED, LOCAL = "diloco", "diloco_local"  # checkpoint keys


def check_fit(owner: str, optimizers: list, layer_sync: Any, precision_plugin: Any) -> None:
    """ValueError naming the setting of this fit that DiLoCo cannot run with."""
    if len(optimizers) != 1:
        raise ValueError(f"{owner} counts a round in the steps of one optimizer; this LightningModule has "
                         f"{len(optimizers)}")
    if layer_sync is not None:
        raise ValueError(f"{owner} with Trainer(sync_batchnorm=True): that synchronises every forward pass; DiLoCo "
                         f"averages the BatchNorm statistics at each outer sync instead")
    if getattr(precision_plugin, "scaler", None) is not None:
        raise ValueError(f"{owner} with a gradient scaler (precision='16-mixed'): it skips a rank's optimizer step "
                         f"when that rank's gradients overflow, and DiLoCo's rounds must end on the same step on "
                         f"every rank; use precision='bf16-mixed' or 32")


class OuterSync:
    """DiLoCo for one fit of a LightningModule."""

    def __init__(self, owner: str, resolution: Resolution, module: Any, backend: str, options: Mapping[str, str],
                 resume: Optional[Mapping[str, Any]], **settings: Any) -> None:
        group_settings = {**options, **wire_settings(owner, resolution.wire, None)} if backend == BACKEND else {}
        self.group = averaging.outer_group(group_settings, backend)
        self.diloco = outer.DiLoCo(module, averaging=averaging.averaging_for(resolution, self.group), owner=owner,
                                   **settings)
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
        local = {key: state.pop(key) for key in outer.LOCAL_KEYS}
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
            raise ValueError(f"{checkpoint_path} holds DiLoCo's shared state but rank "
                             f"{rank}'s own part, {path}, is missing (each rank writes its part beside the "
                             f"checkpoint, on its own disk)")
        checkpoint.update(checkpoint_io.load_checkpoint(path))
    return {**checkpoint[SHARED], **checkpoint[LOCAL]}
