"""The model a profile measures, with its synthetic batches and loss (imports torch; used by measure.py).

    timm name     timm.create_model(name, pretrained=False, img_size=, num_classes=, patch_size=, depth=),
                  images of N(0, 1) and random labels, cross-entropy (as benchmarks/fleet_ddp.py)
    module:Class  an importable LightningModule (or any torch.nn.Module), built as Class(**init_args); its
                  inputs are random tensors shaped like its `example_input_array` (Lightning's convention)
                  with the profile's batch; the loss is cross-entropy against random labels when it returns
                  one row of logits per sample, else the mean square of what it returns (the backward pass
                  costs the same whichever loss ends the model)
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional


class ModelError(ValueError):
    """The model cannot be built or fed: names it and the cause."""


@dataclass(frozen=True)
class ModelSpec:
    name: str  # timm name or module:Class
    img_size: int = 224
    patch_size: Optional[int] = None
    depth: Optional[int] = None
    num_classes: int = 1000
    init_args: Dict[str, object] = field(default_factory=dict)

    @property
    def is_class(self) -> bool:
        return ":" in self.name

    def args(self) -> Dict[str, object]:
        """What the profile records of how the model was built."""
        if self.is_class:
            return {"init_args": dict(self.init_args)}
        return {k: v for k, v in (("img_size", self.img_size), ("patch_size", self.patch_size),
                                  ("depth", self.depth), ("num_classes", self.num_classes)) if v is not None}


@dataclass
class Built:
    module: object  # torch.nn.Module on the device
    batch: Callable[[int], tuple]  # step -> (inputs, targets) on the device
    loss: Callable[[object, object], object]  # (outputs, targets) -> scalar


def build(spec: ModelSpec, batch: int, device) -> Built:
    import torch

    torch.manual_seed(0)
    module, example = _class_model(spec) if spec.is_class else _timm_model(spec)
    module = module.to(device).train()
    if not any(p.requires_grad for p in module.parameters()):
        raise ModelError(f"{spec.name}: no parameters with gradients")

    def inputs(step: int):
        g = torch.Generator().manual_seed(1000 + step)
        shape = (batch,) + tuple(example.shape[1:])
        if example.dtype.is_floating_point:
            return torch.randn(shape, generator=g, dtype=example.dtype).to(device), g
        # token ids and the like: within the example's range
        return torch.randint(0, int(example.max()) + 1, shape, generator=g, dtype=example.dtype).to(device), g

    with torch.no_grad():
        probe = _first(module(inputs(0)[0]))
    classes = probe.shape[1] if probe.dim() == 2 and probe.shape[0] == batch and probe.is_floating_point() else 0

    def make(step: int):
        x, g = inputs(step)
        return x, (torch.randint(0, classes, (batch,), generator=g).to(device) if classes else None)

    def loss(out, y):
        out = _first(out)
        return torch.nn.functional.cross_entropy(out, y) if classes else out.float().square().mean()

    return Built(module, make, loss)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _timm_model(spec: ModelSpec):
    import timm
    import torch

    if not timm.is_model(spec.name):
        raise ModelError(f"{spec.name!r} is not a timm model (timm.list_models('vit_*') lists some) and not "
                         f"module:Class")
    kwargs = {k: v for k, v in (("patch_size", spec.patch_size), ("depth", spec.depth)) if v}
    try:
        model = timm.create_model(spec.name, pretrained=False, img_size=spec.img_size,
                                  num_classes=spec.num_classes, **kwargs)
    except TypeError as e:  # a model that takes no img_size or patch_size
        raise ModelError(f"timm model {spec.name}: {e}") from None
    return model, torch.zeros(1, 3, spec.img_size, spec.img_size)


def _class_model(spec: ModelSpec):
    import torch

    module_name, _, class_name = spec.name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as e:
        raise ModelError(f"{spec.name}: cannot import {module_name} ({e})") from None
    except AttributeError:
        raise ModelError(f"{spec.name}: {module_name} has no {class_name}") from None
    try:
        module = cls(**spec.init_args)
    except Exception as e:
        raise ModelError(f"{spec.name}({', '.join(f'{k}={v!r}' for k, v in spec.init_args.items())}): "
                         f"{type(e).__name__}: {e}") from None
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{spec.name} is not a torch.nn.Module (a LightningModule is one)")
    example = getattr(module, "example_input_array", None)
    if not isinstance(example, torch.Tensor) or example.dim() < 1:
        raise ModelError(f"{spec.name} has no example_input_array tensor: set one in its __init__ (one batch of "
                         f"inputs, Lightning's convention), so that mccl plan knows what to feed it")
    return module, example
