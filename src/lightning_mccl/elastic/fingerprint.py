"""The job's fingerprint: what a joiner must share with the running job before it may enter a quorum.

A joiner receives the whole training state from a member (state_transfer.py) and then trains with the others
under one DDP. That only works when it runs the same program: the state it is sent must load into its model, and
the gradients it contributes must belong to the same parameters, computed by the same code with the same
settings. A joiner that differs fails late and far from the cause: `load_state_dict` raises after the group was
re-formed around it (a dropped step for every member), or worse, the state loads and the job trains on with a
member that computes something else. So a joiner compares its fingerprint with the job's first, and is refused
(`JoinRefused`) before it registers: it never enters a quorum, and the members are not disturbed.

What is compared, and why:

- the package version (`lightning_mccl.__version__`): the membership protocol, the Store's keys and the state's
  layout belong to one version;
- torch's version: the state travels as `torch.save` bytes, and DDP's buckets and the optimizers' arithmetic
  are torch's; two versions need not agree on either;
- the model's signature: the name, dtype and shape of every tensor in the user's state (`state_dict()`, walked
  through nested dicts, lists and tuples, the names joined by dots), as a readable list and a digest of it. No
  tensor is sent. An optimizer's per-parameter state (the ``state`` of a dict that holds ``state`` and
  ``param_groups``, as `torch.optim.Optimizer.state_dict()` returns) is left out: the optimizer creates it at
  its first step, so a joiner that has not trained lacks what the job holds, and it is sent anyway;
- the config hash: what the user passes as `config` (a string is hashed as it is, anything else as its JSON with
  sorted keys; none gives no hash, which only matches none). The model's shapes do not show a learning rate,
  a loss or a data set; the config does, when the user passes it (the Lightning layer passes its CLI config).

Host 0's member publishes the job's fingerprint once, when it starts (``fingerprint`` under the elastic keys).
A joiner waits for it (the elastic timeout), compares, and on a difference writes one entry in the ``refused``
log (host 0's member prints it at its next step boundary) and raises `JoinRefused`, naming the first
differences.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

import lightning_mccl

from .board import Board
from .errors import ElasticError, JoinRefused

KEY = "fingerprint"
REFUSED_LOG = "refused"  # one entry per joiner refused: its host, process id and why
NAMED = 3  # differences a refusal names; the rest are counted
HASH_SHOWN = 12  # hex digits of a config hash a message shows


@dataclass(frozen=True)
class Fingerprint:
    """One process's side of the comparison (module docstring). `model`: (name, "float32[10, 64]") per tensor,
    in the order the user's state holds them; `config`: the config's SHA-256, "" when none was given."""

    package: str
    torch: str
    model: Tuple[Tuple[str, str], ...]
    config: str

    @property
    def model_digest(self) -> str:
        """SHA-256 of the sorted signature list: equal exactly when the tensors' names, dtypes and shapes are."""
        return hashlib.sha256(json.dumps(sorted(self.model)).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"package": self.package, "torch": self.torch, "model_digest": self.model_digest,
                "model": [list(pair) for pair in self.model], "config": self.config}

    @classmethod
    def from_json(cls, value: dict) -> "Fingerprint":
        return cls(package=value["package"], torch=value["torch"], model=tuple(map(tuple, value["model"])),
                   config=value["config"])


def of(state_dict: Callable[[], Any], config: Any = None) -> Fingerprint:
    """This process's fingerprint: the user's state as `state_dict()` returns it, and its `config`."""
    return Fingerprint(package=lightning_mccl.__version__, torch=torch.__version__,
                       model=tuple((name, signature(t)) for name, t in tensors(state_dict())),
                       config=config_hash(config))


def tensors(state: Any, prefix: str = "") -> Iterator[Tuple[str, torch.Tensor]]:
    """Every tensor in `state` with its dotted name, walking dicts, lists and tuples; an optimizer's
    per-parameter state is skipped (module docstring). Other values (numbers, strings) are not compared."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
        return
    if isinstance(state, Mapping):
        items = [(k, v) for k, v in state.items() if not (k == "state" and "param_groups" in state)]
    elif isinstance(state, (list, tuple)):
        items = list(enumerate(state))
    else:
        return
    for key, value in items:
        yield from tensors(value, f"{prefix}.{key}" if prefix else str(key))


def signature(tensor: torch.Tensor) -> str:
    """"float32[10, 64]"; a scalar is "float32[]"."""
    return f"{str(tensor.dtype).replace('torch.', '')}[{', '.join(map(str, tensor.shape))}]"


def config_hash(config: Any) -> str:
    """SHA-256 of the config: a string as it is, anything else as JSON with sorted keys; "" for None."""
    if config is None:
        return ""
    if isinstance(config, str):
        text = config
    else:
        try:
            text = json.dumps(config, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise TypeError(f"mccl elastic: config must be a string or JSON-able (dicts, lists, strings, numbers, "
                            f"booleans, None), to be hashed the same way on every Mac: {e}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def differences(mine: Fingerprint, job: Fingerprint) -> List[str]:
    """What differs, one phrase each, in this order: the package, torch, the model's tensors, the config."""
    found = []
    if mine.package != job.package:
        found.append(f"lightning_mccl {mine.package} here, {job.package} in the job: install the same version on "
                     f"every Mac")
    if mine.torch != job.torch:
        found.append(f"torch {mine.torch} here, {job.torch} in the job: install the same version on every Mac")
    if mine.model_digest != job.model_digest:
        found.extend(_model_differences(dict(mine.model), dict(job.model)))
    if mine.config != job.config:
        found.append(f"the config differs ({_shown(mine.config)} here, {_shown(job.config)} in the job)")
    return found


def _model_differences(mine: Dict[str, str], job: Dict[str, str]) -> List[str]:
    """Per tensor, in the job's order and then this process's: the first says "its model differs"."""
    found = []
    for name, theirs in job.items():
        if name not in mine:
            found.append(f"'{name}' ({theirs}) is in the job's model, not here")
        elif mine[name] != theirs:
            found.append(f"'{name}' is {mine[name]} here, {theirs} in the job")
    found.extend(f"'{name}' ({ours}) is here, not in the job's model" for name, ours in mine.items()
                 if name not in job)
    return [("its model differs: " if i == 0 else "") + text for i, text in enumerate(found)]


def _shown(config: str) -> str:
    return f"hash {config[:HASH_SHOWN]}" if config else "no config given"


def refusal(found: List[str]) -> str:
    """The first NAMED differences, and how many more."""
    more = len(found) - NAMED
    return "; ".join(found[:NAMED]) + (f" (and {more} more difference{'s' if more > 1 else ''})" if more > 0 else "")


def publish(board: Board, mine: Fingerprint) -> None:
    """Host 0's member, at its start: the job's fingerprint, for joiners to compare with."""
    board.set(KEY, mine.to_json())


def admit(board: Board, mine: Fingerprint, info: dict, timeout: float) -> None:
    """A joiner, before it registers: return when `mine` matches the job's fingerprint; otherwise note the
    refusal in the refused log (with `info`: host, process id) and raise `JoinRefused`."""
    job: Optional[dict] = board.get_when_set(KEY, time.monotonic() + timeout)
    if job is None:
        raise ElasticError(f"mccl elastic: this joiner found no running job at {board.address}: host 0's member "
                           f"publishes the job's fingerprint when it starts, and none came within {timeout:g} s "
                           f"(the elastic timeout). Is the job there an elastic one, and started?")
    found = differences(mine, Fingerprint.from_json(job))
    if found:
        why = refusal(found)
        board.append(REFUSED_LOG, {**info, "why": why})
        raise JoinRefused(f"mccl elastic: this joiner cannot join the job: {why}")


__all__ = ["Fingerprint", "of", "tensors", "signature", "config_hash", "differences", "refusal", "publish", "admit",
           "KEY", "REFUSED_LOG"]
