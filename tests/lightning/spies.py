"""Spies the in-process strategy tests (`test_strategy_mps`, `test_fabric`) install through monkeypatch, to
see what a strategy asks torch for: the arguments of `init_process_group`, and any CUDA stream."""
from __future__ import annotations

from typing import List, Optional, Type

import torch
import torch.distributed as dist


def spy_init_process_group(monkeypatch, stop: Optional[Type[BaseException]] = None) -> List[dict]:
    """Records the keyword arguments of every `dist.init_process_group` call in the list it returns; each call
    then goes on to torch's, or raises `stop` when given (to see what a strategy passes without a group)."""
    calls: List[dict] = []
    real_init = dist.init_process_group

    def init_spy(*args, **kwargs):
        calls.append(kwargs)
        if stop is not None:
            raise stop
        return real_init(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init_spy)
    return calls


def forbid_cuda_stream(monkeypatch) -> None:
    """`torch.cuda.Stream()` fails the test: a strategy on a CUDA-less Mac must not create one."""
    def no_cuda_stream(*args, **kwargs):
        raise AssertionError("torch.cuda.Stream() was created")

    monkeypatch.setattr(torch.cuda, "Stream", no_cuda_stream)
