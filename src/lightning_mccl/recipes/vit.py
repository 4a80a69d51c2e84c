"""`ViTClassifier`: fine-tunes (or trains) a timm Vision Transformer for image classification.

The model is any timm model name; ViTs accept ``img_size``/``patch_size`` overrides, so the default
ViT-Tiny runs on 32x32 images as a 4x4 grid of 8x8 patches. Weights come from, in order:
``checkpoint_path`` (a local weights file: timm/Hugging Face ``.safetensors``/``.pth``/``.bin`` or a
Lightning ``.ckpt`` of this recipe), ``pretrained=True`` (timm's download, or its local cache when
offline), or random initialisation. A new classification head is always created for
``num_classes``. Pretrained weights that cannot be had are never skipped silently: a warning names
the reason and the run continues from random initialisation (``weights_source`` says which happened).

Optimisation: AdamW (no weight decay on biases, norms, position embedding and class token), a linear
warm-up then cosine decay to zero, stepped every optimizer step, cross-entropy with label smoothing.
Logged: ``train/loss``, ``train/acc``, ``val/loss``, ``val/acc`` (accuracy over every rank's samples)
and ``train/samples_per_s`` (images per second over all ranks, each epoch's training steps only).

Resuming with ``ckpt_path`` reproduces an uninterrupted run (same weights, bit for bit on CPU) as long
as the model draws no random numbers while training: the default has no dropout or drop-path, and the
data augmentation of `ImageDataModule` is seeded per batch. Lightning does not save the global RNG
in checkpoints, so ``model_kwargs: {drop_path_rate: 0.1}`` (say) resumes close to, not exactly on,
the uninterrupted run.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import sys
import time
from typing import Optional

import timm
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics.classification import MulticlassAccuracy

HF_HOST = "huggingface.co"


class PretrainedWeightsUnavailable(UserWarning):
    """Pretrained weights were asked for but could not be loaded; the model starts from random weights."""


def _hub_resolves(host: str = HF_HOST) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """Puts huggingface_hub in offline mode (cache only) for the duration, instead of retrying for a minute."""
    if not offline:
        yield
        return
    try:
        from huggingface_hub import constants
    except ImportError:  # timm without huggingface_hub: nothing to switch
        yield
        return
    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def read_state_dict(path: str) -> dict:
    """The model weights in `path`: a timm/HF weights file or a Lightning checkpoint of `ViTClassifier`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint_path {path} is not a file")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"checkpoint_path {path} could not be read as weights ({type(e).__name__}: {e})") from e
    if isinstance(state, dict):
        for key in ("state_dict", "model", "state_dict_ema"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint_path {path} holds no state dict of tensors")
    # A Lightning checkpoint of this recipe stores the timm model under "model."; DDP adds "module.".
    for prefix in ("model.", "module."):
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def load_backbone(model: torch.nn.Module, state: dict, source: str) -> None:
    """Loads `state` into `model` except its classifier (a new head is kept), adapting position and
    patch embeddings to the model's image and patch size where timm knows how. Any other mismatch is an
    error naming the keys."""
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if filter_fn is not None:
        state = filter_fn(state, model)
    head_keys = set()
    classifier = getattr(model, "pretrained_cfg", {}).get("classifier")
    for name in ([classifier] if isinstance(classifier, str) else list(classifier or [])):
        head_keys |= {f"{name}.weight", f"{name}.bias"}
    state = {k: v for k, v in state.items() if k not in head_keys}
    own = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
             if k in own and own[k].shape != v.shape]
    missing = sorted(set(own) - set(state) - head_keys)
    unexpected = sorted(set(state) - set(own))
    if wrong or missing or unexpected:
        details = "; ".join(part for part in (
            f"shape mismatch: {', '.join(wrong[:5])}" if wrong else "",
            f"missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}" if missing else "",
            f"unexpected: {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}" if unexpected else "",
        ) if part)
        architecture = getattr(model, "pretrained_cfg", {}).get("architecture", "?")
        raise ValueError(f"weights in {source} do not fit {type(model).__name__} ({architecture}): {details}")
    model.load_state_dict(state, strict=False)


class ViTClassifier(LightningModule):
    """Image classification with a timm Vision Transformer.

    Args:
        model_name: a timm model name (``timm.list_models("vit_*")``).
        num_classes: classes of the dataset; the head is created for them.
        img_size: input side in pixels (ViTs adapt their position embedding to it).
        patch_size: side of a patch in pixels (ViTs only; ``None`` keeps the model's).
        pretrained: start from timm's pretrained weights (downloaded, or read from the local cache).
        checkpoint_path: start from the weights in this local file instead.
        model_kwargs: more arguments for ``timm.create_model`` (``depth``, ``drop_path_rate``, ...).
        lr: peak learning rate, reached after the warm-up.
        weight_decay: AdamW decoupled weight decay (not applied to biases, norms and embeddings).
        warmup_epochs: length of the linear warm-up, in epochs (fractions allowed).
        schedule_epochs: epochs the warm-up + cosine schedule spans; default ``trainer.max_epochs``.
            The schedule always follows the current configuration: a run resumed with ``ckpt_path``
            continues at its saved step on it. A run interrupted and resumed with the same config
            therefore matches an uninterrupted one; set this only when a run deliberately stops
            before its planned length (``max_epochs`` < ``schedule_epochs``) to be resumed later.
        label_smoothing: for the cross-entropy loss.
    """

    def __init__(
        self,
        model_name: str = "vit_tiny_patch16_224",
        num_classes: int = 10,
        img_size: Optional[int] = 32,
        patch_size: Optional[int] = 8,
        pretrained: bool = False,
        checkpoint_path: Optional[str] = None,
        model_kwargs: Optional[dict] = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        warmup_epochs: float = 1.0,
        schedule_epochs: Optional[int] = None,
        label_smoothing: float = 0.1,
    ):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        if warmup_epochs < 0 or (schedule_epochs is not None and schedule_epochs < 1):
            raise ValueError(
                f"warmup_epochs must be >= 0 and schedule_epochs >= 1, got {warmup_epochs} and {schedule_epochs}")
        self.save_hyperparameters()
        kwargs = dict(model_kwargs or {})
        if img_size is not None:
            kwargs["img_size"] = img_size
        if patch_size is not None:
            kwargs["patch_size"] = patch_size
        self.model, self.weights_source = self._create_model(
            model_name, num_classes, pretrained, checkpoint_path, kwargs)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.train_samples = 0  # over all ranks, since this process started
        self.train_time_s = 0.0
        self._epoch_samples = 0
        self._epoch_start = None
        self._epoch_last = None

    @staticmethod
    def _create_model(name: str, num_classes: int, pretrained: bool, checkpoint_path: Optional[str], kwargs: dict):
        if not timm.is_model(name):
            raise ValueError(f"{name!r} is not a timm model; see timm.list_models('vit_*')")
        if checkpoint_path:
            model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
            load_backbone(model, read_state_dict(checkpoint_path), checkpoint_path)
            return model, f"checkpoint {checkpoint_path}"
        if pretrained:
            offline = not _hub_resolves()
            try:
                with _hub_offline(offline):
                    model = timm.create_model(name, pretrained=True, num_classes=num_classes, **kwargs)
                return model, "pretrained"
            except Exception as e:  # no network and no cache, no weights for this name, ...
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                where = f"{HF_HOST} is unreachable and they are not in the local cache" if offline else reason
                rank_zero_warn(
                    f"pretrained weights for {name} could not be loaded ({where}); the model starts from RANDOM "
                    f"weights. Run once with network access to cache them, or pass checkpoint_path=<weights file>.",
                    category=PretrainedWeightsUnavailable)
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs), "random"

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    # -- steps ----------------------------------------------------------------------------------------

    def training_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        self.train_acc(logits, labels)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        self.val_acc(logits, labels)
        # The loss is averaged over ranks here; the Accuracy metric gathers its counts from every rank
        # when it is computed at the end of the epoch.
        self.log("val/loss", loss, on_epoch=True, sync_dist=True)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True, sync_dist=True)

    # -- throughput -----------------------------------------------------------------------------------

    def on_train_epoch_start(self) -> None:
        self._epoch_samples, self._epoch_start, self._epoch_last = 0, time.perf_counter(), None

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self._epoch_samples += len(batch[1])
        self._epoch_last = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        if self._epoch_last is None:
            return
        seconds = self._epoch_last - self._epoch_start
        samples = self._epoch_samples * self.trainer.world_size
        self.train_samples += samples
        self.train_time_s += seconds
        self.log("train/samples_per_s", samples / max(seconds, 1e-9), sync_dist=True)

    # -- optimisation ---------------------------------------------------------------------------------

    def configure_optimizers(self):
        from timm.optim import param_groups_weight_decay

        no_decay = getattr(self.model, "no_weight_decay", lambda: set())()
        groups = param_groups_weight_decay(self.model, self.hparams.weight_decay, no_weight_decay_list=no_decay)
        optimizer = torch.optim.AdamW(groups, lr=self.hparams.lr)
        total, warmup = self._schedule_steps()
        # A partial, not a callable object: LambdaLR would save an object's attributes in the checkpoint and
        # restore them on resume, overriding the schedule of the run being resumed with the old one.
        schedule = functools.partial(warmup_cosine, warmup=warmup, total=total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _schedule_steps(self):
        trainer = self.trainer
        estimated = trainer.estimated_stepping_batches  # loads the train dataloader if needed
        steps_per_epoch = max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))
        if self.hparams.schedule_epochs is not None:
            total = steps_per_epoch * self.hparams.schedule_epochs
        elif math.isfinite(estimated):
            total = int(estimated)
        else:
            raise ValueError(
                "set schedule_epochs (or trainer.max_epochs / max_steps): the cosine schedule needs a length")
        warmup = min(total, int(round(self.hparams.warmup_epochs * steps_per_epoch)))
        return max(total, 1), warmup


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """LR factor at optimizer step `step`: linear from 1/warmup to 1 over `warmup` steps, then cosine down
    to 0 at `total`, and 0 after it."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))
