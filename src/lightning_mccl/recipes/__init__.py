"""Ready-made training recipes for lightning-mccl: a ViT image classifier and its data.

    python examples/vit_finetune.py fit --config configs/vit_local.yaml
"""
from .data import ImageDataModule
from .vit import PretrainedWeightsUnavailable, ViTClassifier

__all__ = ["ImageDataModule", "PretrainedWeightsUnavailable", "ViTClassifier"]
