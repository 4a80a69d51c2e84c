"""Image classification data for the ViT recipe: a `LightningDataModule` over one of three sources.

- ``digits`` (the default, needs no network): scikit-learn's bundled handwritten digits (1797 8x8
  grayscale images, 10 classes), upsampled to ``image_size`` and replicated to 3 channels.
- ``cifar10``: torchvision's CIFAR-10 under ``data_dir`` (downloaded there when missing and online).
- ``imagefolder``: a torchvision ``ImageFolder`` at ``data_dir``, with ``train/`` and ``val/``
  sub-folders, or one folder of class sub-folders that is split like the digits.

Training augmentation (random shift, optional horizontal flip) runs on whole batches after they
reach the device, drawn from a generator seeded by (seed, epoch, batch index, rank). The same run
therefore sees the same augmented batches whether or not it was stopped and resumed from a
checkpoint, which is what makes a resumed run reproduce an uninterrupted one. Distributed sampling
is left to Lightning (it inserts a ``DistributedSampler`` seeded by ``seed_everything``); like every
DistributedSampler, it pads the validation set to a multiple of the world size by repeating up to
world_size - 1 images (1 of the 359 digits on 2 ranks).
"""
from __future__ import annotations

import os
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Subset

DIGITS_CLASSES = 10
CIFAR10_CLASSES = 10
# Pixel statistics used for normalisation; images end up roughly in [-1, 1].
MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)


def load_digits_tensors(image_size: int = 32):
    """scikit-learn's digits as float images (N, 3, image_size, image_size) in [0, 1] and int64 labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the 'digits' dataset needs scikit-learn (pip install scikit-learn)") from None
    digits = load_digits()
    images = torch.from_numpy(digits.images).float().div_(16.0).unsqueeze(1)  # (N, 1, 8, 8), values 0..16
    if image_size != images.shape[-1]:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = images.clamp_(0.0, 1.0).expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(digits.target).long()
    return images, labels


def split_indices(n: int, val_fraction: float, seed: int):
    """A deterministic (train, val) split of range(n): the same seed always gives the same split."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    n_val = int(round(n * val_fraction))
    if n_val == 0 or n_val == n:
        raise ValueError(f"val_fraction={val_fraction} leaves an empty train or val set for {n} images")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(perm[n_val:]), sorted(perm[:n_val])


class _Normalized(Dataset):
    """Applies the fixed normalisation to an in-memory (image, label) dataset."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        std = torch.tensor(STD).view(1, 3, 1, 1)
        self.images = (images - mean) / std
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def random_shift_flip(images: torch.Tensor, max_shift: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """Shifts each image by up to `max_shift` pixels each way (edges replicated) and, if `flip`, mirrors
    half of them horizontally. Random numbers come from `generator` (a CPU generator), so the result
    depends only on its seed, on every device."""
    b, c, h, w = images.shape
    if max_shift > 0:
        padded = F.pad(images, (max_shift,) * 4, mode="replicate")
        dy = torch.randint(0, 2 * max_shift + 1, (b,), generator=generator).to(images.device)
        dx = torch.randint(0, 2 * max_shift + 1, (b,), generator=generator).to(images.device)
        rows = (dy[:, None] + torch.arange(h, device=images.device)[None, :])[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=images.device)[None, :])[:, None, None, :]
        batch = torch.arange(b, device=images.device)[:, None, None, None]
        chan = torch.arange(c, device=images.device)[None, :, None, None]
        images = padded[batch, chan, rows, cols]
    if flip:
        mask = (torch.rand(b, generator=generator) < 0.5).to(images.device)[:, None, None, None]
        images = torch.where(mask, images.flip(-1), images)
    return images


class ImageDataModule(LightningDataModule):
    """Image classification data for `ViTClassifier`.

    Args:
        dataset: ``digits`` (scikit-learn, offline), ``cifar10`` (torchvision) or ``imagefolder``.
        data_dir: where CIFAR-10 is (or is downloaded to), or the ImageFolder root.
        image_size: side of the square images the model sees.
        batch_size: per process (per rank), like every Lightning ``DataLoader``.
        val_fraction: share held out for validation when the source has no separate split (digits,
            an ImageFolder without ``train/``/``val/``); the split depends only on ``seed``.
        seed: seeds the split and the augmentation (with epoch, batch index and rank).
        max_shift: training augmentation: random shift by up to this many pixels (0 turns it off).
        hflip: training augmentation: random horizontal flips (off for digits, whose mirror images
            are not digits; on for natural images such as CIFAR-10).
        num_workers: ``DataLoader`` workers; 0 (the default) suits the in-memory digits.
        download: for ``cifar10``: download when missing (needs network).
    """

    def __init__(
        self,
        dataset: Literal["digits", "cifar10", "imagefolder"] = "digits",
        data_dir: Optional[str] = None,
        image_size: int = 32,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        seed: int = 0,
        max_shift: int = 2,
        hflip: bool = False,
        num_workers: int = 0,
        download: bool = True,
    ):
        super().__init__()
        if dataset not in ("digits", "cifar10", "imagefolder"):
            raise ValueError(f"dataset must be 'digits', 'cifar10' or 'imagefolder', got {dataset!r}")
        if dataset == "imagefolder" and not data_dir:
            raise ValueError("dataset='imagefolder' needs data_dir: a folder of class sub-folders (or train/ and val/)")
        if image_size < 1 or batch_size < 1:
            raise ValueError(f"image_size and batch_size must be positive, got {image_size} and {batch_size}")
        if max_shift < 0:
            raise ValueError(f"max_shift must be >= 0, got {max_shift}")
        self.save_hyperparameters()
        self.dataset = dataset
        self.data_dir = data_dir if data_dir is not None else os.path.join("data", dataset)
        self.image_size = image_size
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.max_shift = max_shift
        self.hflip = hflip
        self.num_workers = num_workers
        self.download = download
        self.num_classes = self._count_classes()
        self.classes: list = []
        self.train_set: Optional[Dataset] = None
        self.val_set: Optional[Dataset] = None

    # -- sources --------------------------------------------------------------------------------------

    def _count_classes(self) -> int:
        if self.dataset == "digits":
            return DIGITS_CLASSES
        if self.dataset == "cifar10":
            return CIFAR10_CLASSES
        root = self._imagefolder_train_root()
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not classes:
            raise ValueError(f"ImageFolder {root} has no class sub-folders")
        return len(classes)

    def _imagefolder_train_root(self) -> str:
        if not os.path.isdir(self.data_dir):
            raise FileNotFoundError(f"ImageFolder data_dir {self.data_dir} does not exist")
        train = os.path.join(self.data_dir, "train")
        if os.path.isdir(train) and os.path.isdir(os.path.join(self.data_dir, "val")):
            return train
        return self.data_dir

    def _torchvision_transform(self):
        try:
            from torchvision import transforms
        except ImportError:
            raise ImportError(f"dataset={self.dataset!r} needs torchvision (pip install torchvision)") from None
        return transforms.Compose([
            transforms.Resize((self.image_size, self.image_size)),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ])

    def prepare_data(self) -> None:
        # Called on one process per node before setup(): the place to download.
        if self.dataset == "cifar10":
            from torchvision.datasets import CIFAR10

            if not self._cifar10_present():
                if not self.download:
                    raise FileNotFoundError(f"CIFAR-10 is not in {self.data_dir} and download=False")
                try:
                    CIFAR10(self.data_dir, train=True, download=True)
                    CIFAR10(self.data_dir, train=False, download=True)
                except OSError as e:  # URLError is an OSError
                    raise RuntimeError(
                        f"CIFAR-10 is not in {self.data_dir} and downloading it failed ({e}); copy "
                        f"cifar-10-batches-py/ there, or use dataset=digits, which needs no network") from e

    def _cifar10_present(self) -> bool:
        return os.path.isdir(os.path.join(self.data_dir, "cifar-10-batches-py"))

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        if self.dataset == "digits":
            images, labels = load_digits_tensors(self.image_size)
            train_idx, val_idx = split_indices(len(labels), self.val_fraction, self.seed)
            self.train_set = _Normalized(images[train_idx], labels[train_idx])
            self.val_set = _Normalized(images[val_idx], labels[val_idx])
            self.classes = [str(d) for d in range(DIGITS_CLASSES)]
        elif self.dataset == "cifar10":
            from torchvision.datasets import CIFAR10

            if not self._cifar10_present():
                raise FileNotFoundError(f"CIFAR-10 is not in {self.data_dir}; run prepare_data() (download=True) first")
            tf = self._torchvision_transform()
            self.train_set = CIFAR10(self.data_dir, train=True, transform=tf)
            self.val_set = CIFAR10(self.data_dir, train=False, transform=tf)
            self.classes = list(self.train_set.classes)
        else:
            from torchvision.datasets import ImageFolder

            tf = self._torchvision_transform()
            train_root = self._imagefolder_train_root()
            full = ImageFolder(train_root, transform=tf)
            self.classes = list(full.classes)
            if train_root != self.data_dir:
                val = ImageFolder(os.path.join(self.data_dir, "val"), transform=tf)
                if val.classes != full.classes:
                    raise ValueError(f"{self.data_dir}: train/ and val/ have different class folders "
                                     f"({full.classes} vs {val.classes})")
                self.train_set, self.val_set = full, val
            else:
                train_idx, val_idx = split_indices(len(full), self.val_fraction, self.seed)
                self.train_set, self.val_set = Subset(full, train_idx), Subset(full, val_idx)

    # -- loaders --------------------------------------------------------------------------------------

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    # -- augmentation ---------------------------------------------------------------------------------

    def augmentation_seed(self, epoch: int, batch_idx: int, rank: int) -> int:
        """The seed of one training batch's augmentation; a pure function of its position in the run."""
        p = 1_000_003  # a prime above any epoch, batch index or rank count: distinct positions, distinct seeds
        return (((self.seed * p + epoch) * p + batch_idx) * p + rank) % (2**63)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is None or not trainer.training or (self.max_shift == 0 and not self.hflip):
            return batch
        images, labels = batch
        # The batch being prepared is the next one: the loop counts it as ready only after this hook.
        batch_idx = trainer.fit_loop.epoch_loop.batch_idx + 1
        seed = self.augmentation_seed(trainer.current_epoch, batch_idx, trainer.global_rank)
        generator = torch.Generator().manual_seed(seed)
        return random_shift_flip(images, self.max_shift, self.hflip, generator), labels
