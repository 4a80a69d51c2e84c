"""The strategy names lightning-mccl registers: one table, for the Trainer's registry (`MCCLStrategy`) and
Fabric's (`MCCLFabricStrategy`).

They are Lightning's DDP names with "ddp" replaced by "mccl": Lightning's connectors refuse every name that
contains "ddp" on MPS. The fork variants are left out (Metal does not survive fork()). The compressions are
the Trainer's only: Fabric's strategy has no `compress`.
"""
from __future__ import annotations

from typing import Any

TRAINER, FABRIC = "trainer", "fabric"
BOTH = (TRAINER, FABRIC)

# name: (the strategy's arguments, the front ends that register it)
NAMES = {
    "mccl": ({"start_method": "popen"}, BOTH),
    "mccl_spawn": ({"start_method": "spawn"}, BOTH),
    "mccl_find_unused_parameters_false": ({"find_unused_parameters": False, "start_method": "popen"}, BOTH),
    "mccl_find_unused_parameters_true": ({"find_unused_parameters": True, "start_method": "popen"}, BOTH),
    "mccl_spawn_find_unused_parameters_false": ({"find_unused_parameters": False, "start_method": "spawn"}, BOTH),
    "mccl_spawn_find_unused_parameters_true": ({"find_unused_parameters": True, "start_method": "spawn"}, BOTH),
    "mccl_bf16_compress": ({"compress": "bf16"}, (TRAINER,)),
    "mccl_fp16_compress": ({"compress": "fp16"}, (TRAINER,)),
}


def register(registry: Any, cls: type, front_end: str) -> None:
    """Registers `cls` in `registry` under every name of the table that `front_end` has."""
    for name, (arguments, front_ends) in NAMES.items():
        if front_end in front_ends:
            described = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
            registry.register(name, cls, description=f"DDP over mccl with {described}", override=True, **arguments)
