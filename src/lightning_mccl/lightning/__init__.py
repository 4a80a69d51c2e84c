"""Lightning integration: `MCCLStrategy` (DDP; registered as "mccl", "mccl_spawn", "mccl_bf16_compress", ...),
`MCCLDiLoCoStrategy` ("mccl_diloco"), `MCCLElasticStrategy` ("mccl_elastic") and `MCCLElasticDiLoCoStrategy`
("mccl_elastic_diloco"), in which Macs leave and join while `fit` goes on, with their `ElasticEnvironment`,
Fabric's `MCCLFabricStrategy`, `MacFleetEnvironment`, `CommMetrics`, and `ckpt_path_on_restart()` (resume.py:
`trainer.fit(model, ckpt_path=ckpt_path_on_restart())` resumes after a restart of `mccl launch --max-restarts`).

    import lightning as L
    import lightning_mccl                      # registers the strategy names (either import order works)
    trainer = L.Trainer(strategy="mccl", num_nodes=24)

This module does not import Lightning itself, so that `import lightning_mccl` stays cheap for torch-only users:
the classes are loaded on first access. The names are registered by lightning_mccl.registration.
"""
from __future__ import annotations

from .. import lazy

__all__ = ["CommMetrics", "ElasticEnvironment", "MCCLDiLoCoStrategy", "MCCLElasticDiLoCoStrategy",
           "MCCLElasticStrategy", "MCCLFabricStrategy", "MCCLStrategy", "MacFleetEnvironment", "ckpt_path_on_restart"]

_LAZY = {"MCCLStrategy": "strategy", "MCCLDiLoCoStrategy": "diloco_strategy", "MCCLElasticStrategy": "elastic_strategy",
         "MCCLElasticDiLoCoStrategy": "elastic_diloco_strategy", "ElasticEnvironment": "elastic_environment",
         "MacFleetEnvironment": "environment", "CommMetrics": "comm_metrics", "MCCLFabricStrategy": "fabric",
         "ckpt_path_on_restart": "resume"}
__getattr__, __dir__ = lazy.names(__name__, _LAZY, globals())
