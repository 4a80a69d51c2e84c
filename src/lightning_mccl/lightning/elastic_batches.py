"""`ElasticBatches`: the training data of an elastic fit, dealt step by step (docs/elastic.md, *Lightning*).

`MCCLElasticStrategy` puts it in place of the training `DataLoader` the LightningModule (or DataModule)
returns, keeping that loader's dataset and `collate_fn`. Each batch Lightning takes from it is this member's
slice of one step's global batch, as the elastic sampler dealt it to the members of that step: asking for the
next batch is what starts the step (`next_step`, the strategy's call of `ElasticManager.start_step`), so the
slice is read only once the step's membership is known. Lightning takes one batch at a time here (the object has
a length, so Lightning's loop does not fetch ahead), and a batch is one committed step: a step that the members
drop is redone in the same batch (the strategy's `optimizer_step`), so an epoch is always
``ceil(len(dataset) / global_batch)`` batches long and Lightning's step and epoch counters follow the sampler's.

Under elastic DiLoCo a step is a round of H inner steps (`per_step`): the member's slice of the round is split
into H batches, in order (`np.array_split`), and the next round starts with the batch after the H-th.

The dataset is read by index (`dataset[i]`) in the training process: a map-style dataset, no worker processes
(a worker prefetching ahead would read for a membership that may not hold). A member dealt no sample (the last
step of an epoch, smaller than the quorum) gets an empty batch: the collated form of one sample, cut to length
zero, so that its forward and backward still run and its gradients count for nothing.
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Optional

import numpy as np
import torch
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, IterableDataset

from ..elastic import Step


class ElasticBatches:
    """Batches of one member's slices of the steps' global batches (module docstring)."""

    def __init__(self, dataset: Any, collate_fn: Callable, global_batch: int,
                 next_step: Callable[[], Optional[Step]], per_step: int = 1):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.global_batch = global_batch  # the samples of one step (a round under DiLoCo) over all members
        self.per_step = per_step
        self._next_step = next_step
        self._left: List[np.ndarray] = []  # the current step's batches not taken yet
        self.taken = 0  # the samples of the last batch taken

    @classmethod
    def replacing(cls, loader: DataLoader, global_batch: int, next_step: Callable[[], Optional[Step]],
                  per_step: int = 1) -> "ElasticBatches":
        """In place of the user's training `loader` (its dataset and collate_fn); ValueError naming what it cannot
        take."""
        if not isinstance(loader, DataLoader):
            raise ValueError(f"MCCLElasticStrategy: the training data must be a torch DataLoader over a map-style "
                             f"dataset (the members read it by sample id), got a {type(loader).__name__}")
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError(f"MCCLElasticStrategy: the training DataLoader's dataset is an IterableDataset "
                             f"({type(loader.dataset).__name__}); the members read samples by id (dataset[i]), so it "
                             f"must be map-style (with __getitem__ and __len__)")
        return cls(loader.dataset, loader.collate_fn, global_batch, next_step, per_step)

    def __len__(self) -> int:
        """Batches per epoch: the steps of one pass over the dataset, each `per_step` batches."""
        return math.ceil(len(self.dataset) / self.global_batch) * self.per_step

    def __iter__(self) -> "ElasticBatches":
        return self

    def __next__(self) -> Any:
        if not self._left:
            step = self._next_step()
            if step is None:  # this member left the job
                raise StopIteration
            self._left = self.split(step.ids)
        ids = self._left.pop(0)
        self.taken = len(ids)
        return self.batch(ids)

    @property
    def step_ends(self) -> bool:
        """The batch taken last is its step's last."""
        return not self._left

    def split(self, ids: np.ndarray) -> List[np.ndarray]:
        """A step's ids as its `per_step` batches, in order."""
        return np.array_split(ids, self.per_step)

    def batch(self, ids: np.ndarray) -> Any:
        """The collated samples `ids` (an empty batch for none)."""
        if len(ids):
            return self.collate_fn([self.dataset[int(i)] for i in ids])
        one = self.collate_fn([self.dataset[0]])
        return tree_map(lambda x: x[:0] if isinstance(x, torch.Tensor) else x, one)


__all__ = ["ElasticBatches"]
