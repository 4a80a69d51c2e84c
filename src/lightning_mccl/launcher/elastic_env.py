"""The variables `mccl launch --elastic` and `mccl join` give every rank they start, and how a rank reads them
(`ElasticManager.from_env` does; docs/elastic.md, *Launching*). Declared here, on the launcher's side, which
loads no torch, so that both sides name them from one place.

- MCCL_ELASTIC=1: the rank runs in an elastic job (the launcher goes on when a rank exits);
- MCCL_ELASTIC_MIN_MEMBERS: the fewest members the job goes on with (``--min-nodes K`` times the ranks of one
  node), set only when ``--min-nodes`` is given: `ElasticSettings.min_members` otherwise;
- MCCL_ELASTIC_JOIN=1: the rank joins a running job (`mccl join`) instead of meeting the others at the
  rendezvous.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, TypeVar

ELASTIC_VAR = "MCCL_ELASTIC"
MIN_MEMBERS_VAR = "MCCL_ELASTIC_MIN_MEMBERS"
JOIN_VAR = "MCCL_ELASTIC_JOIN"
ELASTIC_VARS = (ELASTIC_VAR, MIN_MEMBERS_VAR, JOIN_VAR)

Settings = TypeVar("Settings")


def elastic_env(min_members: Optional[int], joining: bool) -> dict:
    """The variables of a rank of an elastic job (see the module docstring)."""
    env = {ELASTIC_VAR: "1"}
    if min_members is not None:
        env[MIN_MEMBERS_VAR] = str(min_members)
    if joining:
        env[JOIN_VAR] = "1"
    return env


def with_launched_minimum(settings: Settings, environ: Optional[Mapping[str, str]] = None) -> Settings:
    """`settings` (an `ElasticSettings`) with ``min_members`` from MCCL_ELASTIC_MIN_MEMBERS when the launcher
    set it; ValueError naming the variable when it is not a positive integer."""
    environ = os.environ if environ is None else environ
    text = environ.get(MIN_MEMBERS_VAR, "")
    if not text:
        return settings
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MIN_MEMBERS_VAR}={text!r} is not a positive number of members (mccl launch --elastic "
                         f"--min-nodes sets it)")
    return dataclasses.replace(settings, min_members=value)


def launched_as_joiner(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether `mccl join` started this rank (MCCL_ELASTIC_JOIN=1)."""
    environ = os.environ if environ is None else environ
    return environ.get(JOIN_VAR, "") == "1"


__all__ = ["ELASTIC_VAR", "MIN_MEMBERS_VAR", "JOIN_VAR", "ELASTIC_VARS", "elastic_env", "with_launched_minimum",
           "launched_as_joiner"]
