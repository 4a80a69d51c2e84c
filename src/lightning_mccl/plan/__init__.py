"""`mccl plan`: what a training step will take on a fleet of N Macs, before anyone buys them.

A compute profile of the model on one device (profile.py, measured by measure.py with torch), a link and
the engine's costs (link.py), DDP's buckets (buckets.py) and the schedule that overlaps their allreduces
with the backward pass (schedule.py) give each method's step (methods.py: DDP, bf16, int8, PowerSGD,
DiLoCo) for every fleet size (predict.py); report.py writes the table, CSV and plot. docs/scaling.md
describes the model, its assumptions and how it compares with the fleet stand-in.

Only measure.py, models.py, kernels.py and devices.py import torch, and only when a profile is measured.
"""
from .link import Link
from .predict import Prediction, Settings, build_methods, predict
from .profile import Profile, ProfileError, load, save

__all__ = ["Link", "Prediction", "Profile", "ProfileError", "Settings", "build_methods", "load", "predict", "save"]
