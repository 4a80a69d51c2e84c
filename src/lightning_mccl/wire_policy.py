"""How gradients and pseudo-gradients travel: one row per `compress` value, resolved once per fit.

Every choice `compress` makes lives in the table below, and nowhere else: the engine's wire type, the cast on
an accelerator, the 8-bit codec, the DDP comm hook, the default bucket size, DiLoCo's averaging, and the method
`mccl plan` models. The Trainer's and Fabric's strategies, DiLoCo and `mccl plan` read a row, or the one
`Resolution` that `resolve` makes of it at setup, once the device is known. Adding a format (fp8, say) is a row
here plus its codec. No torch here: `mccl plan` and the command line read it without loading torch.

    compress     on the CPU, over mccl             on an accelerator, or over Gloo    DiLoCo's pseudo-gradients
    None         float32                           float32                            float32
    "bf16"       the engine narrows on the wire    torch's bf16 hook, cast on the     as DDP's, in one allreduce
                 (MCCL_WIRE_DTYPE=bf16)            device before staging
    "fp16"       likewise, fp16                    likewise, fp16                     likewise
    "bf16_hook"  torch's bf16_compress_hook        the same                           -
    "fp16_hook"  torch's fp16_compress_hook        the same                           -
    "powersgd"   torch's PowerSGD hook, one bucket the same                           -
    "int8"       the engine's 8-bit allreduce with error feedback (mccl only)         the same, per round

Why the engine's wire type on the CPU and the hook on an accelerator: the hook's cast runs on the device, so the
copies through host memory move half the bytes too; on the CPU the engine's narrowing needs no Python hook
(docs/performance.md, "MCCLStrategy(compress=...)").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Literal, Optional

# The values of `compress`: these literals live here only (tests/lightning/test_wire_policy.py checks src/).
BF16, FP16, BF16_HOOK, FP16_HOOK, POWERSGD, INT8 = "bf16", "fp16", "bf16_hook", "fp16_hook", "powersgd", "int8"
FLOAT32 = "float32"  # how the row without compression is named in messages and as DiLoCo's wire in `mccl plan`
DDP = "ddp"  # the method `mccl plan` calls DDP without compression
WIRE_ENV = "MCCL_WIRE_DTYPE"  # the engine's wire type, read by a group when it is made (docs/settings.md)
MCCL = "mccl"

# DDP comm hooks, by what they do (lightning/hooks.py builds them): a 16-bit cast, PowerSGD, the 8-bit allreduce.
CAST, LOW_RANK, EIGHT_BIT = "cast", "low_rank", "eight_bit"
# DiLoCo's averaging of a round's pseudo-gradients (diloco.py builds it): one allreduce on the outer group (whose
# wire type the engine applies), a 16-bit cast on the device first, the 8-bit allreduce.
ALLREDUCE, CAST_MEAN, INT8_MEAN = "allreduce", "cast_mean", "int8_mean"
# DDP's bucket sizes over mccl, in MB (docs/performance.md, "DDP settings for fleets"; docs/int8.md for 8 bits):
# PowerSGD wants one bucket, so that its chain of collectives and matrix work runs once a step.
BUCKET_MB = 5.0
ONE_BUCKET_MB = 1000.0
INT8_BUCKET_MB = 25.0
# PowerSGDState's arguments unless compress_options says otherwise; batch_tensors_with_same_shape: one matrix
# product and orthogonalisation per shape (docs/performance.md, "DDP settings for fleets").
POWERSGD_DEFAULTS = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 10, "use_error_feedback": True,
                     "warm_start": True, "batch_tensors_with_same_shape": True}


@dataclass(frozen=True)
class Row:
    """What one `compress` value does (the module docstring's table)."""

    compress: Optional[str]
    half: Optional[str] = None  # a 16-bit format: the engine's wire type on the CPU, else the cast's dtype
    hook: Optional[str] = None  # the DDP comm hook wherever the engine does not narrow (CAST, LOW_RANK, EIGHT_BIT)
    bucket_mb: float = BUCKET_MB  # DDP's bucket size over mccl
    diloco: bool = False  # whether DiLoCo's pseudo-gradients may travel this way
    mccl_only: bool = False  # the engine's own format: no other backend has it
    plan: str = DDP  # the method `mccl plan` models for DDP with this row (plan/methods.py)
    options: Optional[Dict[str, object]] = None  # the hook's default options (compress_options may override)

    @property
    def name(self) -> str:
        return self.compress or FLOAT32


ROWS: Dict[Optional[str], Row] = {r.compress: r for r in (
    Row(None, diloco=True),
    Row(BF16, half=BF16, hook=CAST, diloco=True, plan=BF16),
    Row(FP16, half=FP16, hook=CAST, diloco=True, plan=BF16),
    Row(BF16_HOOK, half=BF16, hook=CAST, plan=BF16),
    Row(FP16_HOOK, half=FP16, hook=CAST, plan=BF16),
    Row(POWERSGD, hook=LOW_RANK, bucket_mb=ONE_BUCKET_MB, plan=POWERSGD, options=POWERSGD_DEFAULTS),
    Row(INT8, hook=EIGHT_BIT, bucket_mb=INT8_BUCKET_MB, diloco=True, mccl_only=True, plan=INT8),
)}
CHOICES = tuple(c for c in ROWS if c is not None)
DILOCO_CHOICES = tuple(c for c, r in ROWS.items() if c is not None and r.diloco)
Compress = Literal[CHOICES]  # the strategies' annotation: LightningCLI lists and checks the values
DiLoCoCompress = Literal[DILOCO_CHOICES]


def row(compress: Optional[str], owner: str, diloco: bool = False) -> Row:
    """The row of `compress`; ValueError naming `owner`'s argument for a value that is not one (or, with `diloco`,
    not one for DiLoCo's pseudo-gradients)."""
    found = ROWS.get(compress) if isinstance(compress, str) or compress is None else None
    if found is None:
        raise ValueError(f"{owner}(compress={compress!r}): expected one of {CHOICES} or None")
    if diloco and not found.diloco:
        raise ValueError(f"{owner}(compress={compress!r}): DiLoCo's pseudo-gradients travel as compress="
                         f"{' or '.join(map(repr, DILOCO_CHOICES))} or float32 (compress=None); "
                         f"{compress!r} is a DDP comm hook, and DiLoCo has none")
    return found


@dataclass(frozen=True)
class Resolution:
    """What a fit does, once the device and the backend are known (`resolve`)."""

    row: Row
    wire: Optional[str]  # MCCL_WIRE_DTYPE for the group that carries the values (None: the environment decides)
    hook: Optional[str]  # the DDP comm hook (CAST, LOW_RANK, EIGHT_BIT) or None
    cast: Optional[str]  # the 16-bit format the hook or DiLoCo casts to on the device
    bucket_mb: Optional[float]  # DDP's bucket_cap_mb unless given (None: DDP's own, over another backend)
    averaging: str  # DiLoCo's: ALLREDUCE, CAST_MEAN or INT8_MEAN


def resolve(compress: Optional[str], device_type: str, backend: str, owner: str, diloco: bool = False) -> Resolution:
    """The one resolution of `compress` for tensors on `device_type` ("cpu", "mps", "cuda") over `backend`."""
    r = row(compress, owner, diloco)
    over_mccl = backend == MCCL
    if r.mccl_only and not over_mccl:
        raise ValueError(f"{owner}(compress={compress!r}) needs process_group_backend='mccl': the 8-bit allreduce "
                         f"is the mccl engine's")
    engine_narrows = r.compress == r.half and over_mccl and device_type == "cpu"  # "bf16"/"fp16" on the CPU
    hook = None if engine_narrows else r.hook
    if diloco:
        averaging = INT8_MEAN if r.hook == EIGHT_BIT else CAST_MEAN if r.half and not engine_narrows else ALLREDUCE
        hook = None
    else:
        averaging = ALLREDUCE
    return Resolution(row=r, wire=r.half if engine_narrows else None, hook=hook,
                      cast=r.half if not engine_narrows else None,
                      bucket_mb=r.bucket_mb if over_mccl else None, averaging=averaging)
