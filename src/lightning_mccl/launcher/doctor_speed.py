"""Each host's speed at the job's own model step, for `mccl doctor --model M --batch B` (run by `doctor_bench` on
every rank at once, each on its own Mac, after the links are measured).

The step is `mccl plan`'s (lightning_mccl.plan.measure: zero_grad, forward, loss, backward, optimizer step, a
device synchronize; a timm name or module:Class, fed synthetic batches), on the device the ranks train on
(plan.devices.pick("auto"): mps on a Mac, else cuda, else cpu): WARMUP untimed steps, then `steps` timed; the
median step gives the samples per second. A Mac in Low Power Mode, on battery, hot or sharing its GPU shows
here while its thermal state still reads nominal (`fleet_checks.check_speed` names it).

`measure_step` returns {"device", "device_name", "step_s", "samples_per_s"}, or {"error": "..."} where the model
cannot be built or run here (the other ranks carry on).
"""
from __future__ import annotations

WARMUP = 2
KERNEL_BYTES = 64 << 10  # plan's per-method device work, timed on a token buffer: the doctor does not use it


def measure_step(model: str, batch: int, steps: int) -> dict:
    from ..plan.devices import pick
    from ..plan.measure import MeasureSpec, combine, run_steps
    from ..plan.models import ModelSpec

    try:
        device = pick("auto")
        spec = MeasureSpec(ModelSpec(model), batch, device, steps=steps, warmup=WARMUP, powersgd_ranks=(),
                           kernel_bytes=KERNEL_BYTES, kernel_repeats=1)
        profile = combine(spec, [run_steps(spec, lambda: None)])
    except Exception as e:  # reported in the doctor's table; the fleet's other checks go on
        return {"error": f"{type(e).__name__}: {e}"}
    return {"device": device, "device_name": profile.device_name, "step_s": profile.step_s,
            "samples_per_s": batch / profile.step_s}
