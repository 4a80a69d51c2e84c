"""The convergence benchmark's task: glyphs, a synthetic image classification of controllable difficulty.

Each class is a glyph: `strokes` line segments at fixed places, each with its own colour, drawn anti-aliased
`width` pixels wide (at 16 pixels a side; scaled with `image_size`) on an image of `image_size` pixels a side.
The glyphs are drawn from `data_seed` before the images, or from `glyph_seed` alone when it is not -1: another
set of classes of the same kind (the fine-tuning task's, benchmarks/record/convergence.md). A sample of a class is its glyph
moved as a whole by up to `shift` pixels, each stroke end moved by a Gaussian of `jitter` pixels, each stroke
left out with probability 1 - `keep`, its colours varied a little, drawn over `distractors` random strokes of
random colours (parts of no class) on a smooth random background of amplitude `background` (random colours on a
`grain` x `grain` grid, interpolated bicubically to the image), with pixel noise of standard deviation `noise`.
Classes share nothing by construction, but with many of them in a small image their strokes overlap by place
and colour, and the clutter and noise hide parts of a glyph: the harder settings stay well below
100% for as long as the benchmark trains (benchmarks/record/convergence.md, *The task*).

The train and validation sets are drawn once from `data_seed` alone (never from a run's seed), so every method
and every seed of a run sees the same images; the parent process draws them once and the ranks load them
(`save` / `load`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Tuple

import torch
import torch.nn.functional as F

Tensors = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # train images, labels, val images, labels
CHUNK = 2048  # samples rendered at a time (memory: CHUNK x strokes x pixels floats)


@dataclass(frozen=True)
class GlyphTask:
    classes: int = 64
    image_size: int = 16
    strokes: int = 4  # strokes per class glyph
    shift: float = 2.0  # pixels: largest displacement of the whole glyph, each way
    jitter: float = 0.7  # pixels: standard deviation of each stroke end's displacement
    keep: float = 0.85  # probability that a glyph's stroke is drawn
    distractors: int = 2  # random strokes under the glyph
    background: float = 0.5  # amplitude of the smooth coloured background
    noise: float = 0.3  # standard deviation of the pixel noise
    train_size: int = 20000
    val_size: int = 4096
    data_seed: int = 0
    glyph_seed: int = -1  # -1: the glyphs drawn from data_seed, before the images; else from this seed alone
    width: float = 1.5  # pixels at 16 pixels a side: a stroke's width
    grain: int = 3  # the background's random colours on a grain x grain grid

    def __post_init__(self) -> None:
        if self.classes < 2 or self.image_size < 4 or self.strokes < 1:
            raise ValueError(f"glyph task: classes >= 2, image_size >= 4 and strokes >= 1 needed, got {self}")
        if not 0.0 < self.keep <= 1.0 or min(self.shift, self.jitter, self.background, self.noise) < 0:
            raise ValueError(f"glyph task: keep in (0, 1], shift/jitter/background/noise >= 0 needed, got {self}")
        if self.distractors < 0 or self.train_size < 1 or self.val_size < 1:
            raise ValueError(f"glyph task: distractors >= 0, train_size and val_size >= 1 needed, got {self}")
        if self.glyph_seed < -1 or self.width <= 0 or self.grain < 1:
            raise ValueError(f"glyph task: glyph_seed >= -1, width > 0 and grain >= 1 needed, got {self}")

    def describe(self) -> str:
        glyphs = "" if self.glyph_seed == -1 else f", glyph seed {self.glyph_seed}"
        return (f"glyphs: {self.classes} classes, {self.image_size}x{self.image_size} RGB, {self.strokes} strokes "
                f"{self.width:g} px wide (kept with p {self.keep}), shift {self.shift} px, jitter {self.jitter} px, "
                f"{self.distractors} distractors, background {self.background} (grain {self.grain}), noise "
                f"{self.noise}; {self.train_size} train / {self.val_size} val images, data seed {self.data_seed}"
                f"{glyphs}")

    def generate(self) -> Tensors:
        """(train images, train labels, val images, val labels); images float32 (N, 3, S, S), about zero-mean."""
        g = torch.Generator().manual_seed(self.data_seed)
        own = g if self.glyph_seed == -1 else torch.Generator().manual_seed(self.glyph_seed)
        s = float(self.image_size)
        ends = torch.empty(self.classes, self.strokes, 2, 2).uniform_(0.15 * s, 0.85 * s, generator=own)
        colours = torch.empty(self.classes, self.strokes, 3).uniform_(-1.0, 1.0, generator=own)
        train = self._draw(ends, colours, self.train_size, g)
        val = self._draw(ends, colours, self.val_size, g)
        return train + val

    def _draw(self, ends: torch.Tensor, colours: torch.Tensor, n: int, g: torch.Generator):
        labels = torch.randint(0, self.classes, (n,), generator=g)
        images = torch.cat([self._render(ends, colours, labels[i:i + CHUNK], g) for i in range(0, n, CHUNK)])
        return images, labels

    def _render(self, ends: torch.Tensor, colours: torch.Tensor, labels: torch.Tensor, g: torch.Generator):
        n, k, s = len(labels), self.strokes, self.image_size
        glyph = ends[labels] + torch.empty(n, 1, 1, 2).uniform_(-self.shift, self.shift, generator=g)
        glyph = glyph + self.jitter * torch.randn(n, k, 2, 2, generator=g)
        tint = colours[labels] + 0.15 * torch.randn(n, k, 3, generator=g)
        drawn = (torch.rand(n, k, generator=g) < self.keep).float()
        clutter = torch.empty(n, self.distractors, 2, 2).uniform_(0.0, float(s), generator=g)
        clutter_tint = torch.empty(n, self.distractors, 3).uniform_(-1.0, 1.0, generator=g)
        coarse = torch.randn(n, 3, self.grain, self.grain, generator=g)
        image = self.background * F.interpolate(coarse, size=(s, s), mode="bicubic", align_corners=False)
        width = self.width * s / 16.0  # stroke width in pixels
        # distractors first, so that the glyph's strokes lie over them
        for segs, tints, alpha_scale in ((clutter, clutter_tint, None), (glyph, tint, drawn)):
            for j in range(segs.shape[1]):
                alpha = _coverage(segs[:, j], width, s)
                if alpha_scale is not None:
                    alpha = alpha * alpha_scale[:, j, None, None, None]
                image = image * (1 - alpha) + alpha * tints[:, j, :, None, None]
        return image + self.noise * torch.randn(image.shape, generator=g)

    def save(self, path: str) -> None:
        torch.save({"task": asdict(self), "tensors": self.generate()}, path)


def load(path: str) -> Tuple[GlyphTask, Tensors]:
    saved = torch.load(path, weights_only=True)
    return GlyphTask(**saved["task"]), tuple(saved["tensors"])


def _coverage(seg: torch.Tensor, width: float, size: int) -> torch.Tensor:
    """(n, 1, size, size): how much of each pixel a segment of `width` pixels covers (1 inside, a one-pixel
    linear edge). seg: (n, 2 ends, 2 coordinates x/y) in pixels, pixel centres at i + 0.5."""
    centres = torch.arange(size, dtype=torch.float32) + 0.5
    py, px = centres[None, :, None], centres[None, None, :]
    ax, ay = seg[:, 0, 0, None, None], seg[:, 0, 1, None, None]
    dx, dy = (seg[:, 1, 0] - seg[:, 0, 0])[:, None, None], (seg[:, 1, 1] - seg[:, 0, 1])[:, None, None]
    t = (((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy).clamp_min(1e-6)).clamp(0.0, 1.0)
    dist = torch.hypot(px - (ax + t * dx), py - (ay + t * dy))
    return (width / 2 + 0.5 - dist).clamp(0.0, 1.0)[:, None]
