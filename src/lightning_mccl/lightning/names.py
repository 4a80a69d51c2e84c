"""The strategy names lightning-mccl registers, in the Trainer's registry and Fabric's: one table
(registration.py registers it).

They are Lightning's DDP names with "ddp" replaced by "mccl": Lightning's connectors refuse every name that
contains "ddp" on MPS. The fork variants are left out (Metal does not survive fork()). "mccl_diloco" is the
Trainer's DiLoCo strategy (Fabric loops call `lightning_mccl.diloco.DiLoCo` themselves), "mccl_elastic" and
"mccl_elastic_diloco" its elastic DDP and DiLoCo (Fabric loops run `lightning_mccl.elastic.ElasticManager`
themselves).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from ..wire_policy import BF16, FP16

TRAINER, FABRIC = "trainer", "fabric"
BOTH = (TRAINER, FABRIC)
# front end -> the class its names make, as (module, class): imported only when a name is first used
CLASSES = {TRAINER: ("lightning_mccl.lightning.strategy", "MCCLStrategy"),
           FABRIC: ("lightning_mccl.lightning.fabric", "MCCLFabricStrategy")}
DILOCO = ("lightning_mccl.lightning.diloco_strategy", "MCCLDiLoCoStrategy")
ELASTIC = ("lightning_mccl.lightning.elastic_strategy", "MCCLElasticStrategy")
ELASTIC_DILOCO = ("lightning_mccl.lightning.elastic_diloco_strategy", "MCCLElasticDiLoCoStrategy")

# name: (the strategy's arguments, the front ends that register it, the class when not the front end's own)
NAMES: Dict[str, Tuple[Dict[str, Any], Tuple[str, ...], Any]] = {
    "mccl": ({"start_method": "popen"}, BOTH, None),
    "mccl_spawn": ({"start_method": "spawn"}, BOTH, None),
    "mccl_find_unused_parameters_false": ({"find_unused_parameters": False, "start_method": "popen"}, BOTH, None),
    "mccl_find_unused_parameters_true": ({"find_unused_parameters": True, "start_method": "popen"}, BOTH, None),
    "mccl_spawn_find_unused_parameters_false": ({"find_unused_parameters": False, "start_method": "spawn"}, BOTH,
                                                None),
    "mccl_spawn_find_unused_parameters_true": ({"find_unused_parameters": True, "start_method": "spawn"}, BOTH, None),
    "mccl_bf16_compress": ({"compress": BF16}, BOTH, None),
    "mccl_fp16_compress": ({"compress": FP16}, BOTH, None),
    "mccl_diloco": ({"start_method": "popen"}, (TRAINER,), DILOCO),
    "mccl_elastic": ({"start_method": "popen"}, (TRAINER,), ELASTIC),
    "mccl_elastic_diloco": ({"start_method": "popen"}, (TRAINER,), ELASTIC_DILOCO),
}


def entries(front_end: str) -> Dict[str, Tuple[Tuple[str, str], Dict[str, Any]]]:
    """The names `front_end` registers: name -> ((module, class), arguments)."""
    return {name: (cls or CLASSES[front_end], arguments)
            for name, (arguments, front_ends, cls) in NAMES.items() if front_end in front_ends}
