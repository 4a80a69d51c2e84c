"""The errors of elastic training, each with the sentence a user reads.

Host 0 serves the Store through which the members agree on who is in. It must stay for the whole job: when it
is gone, every other member ends with `HostZeroLost`, whose message starts with `HOST_ZERO_MUST_STAY`.
"""
from __future__ import annotations

import torch.distributed as dist

HOST_ZERO_MUST_STAY = ("host 0 serves the job's Store, through which the members agree on who is in; "
                       "host 0 must stay for the whole job, and the job ends without it")


class ElasticError(RuntimeError):
    """An elastic job cannot go on, for the reason the message gives."""


class HostZeroLost(ElasticError):
    """The Store on host 0 is gone (its process exited or its host is unreachable)."""

    def __init__(self, member: str, address: str, cause: str):
        super().__init__(f"mccl elastic: {HOST_ZERO_MUST_STAY}. Member {member} lost the Store at {address}: "
                         f"{cause}")


class Removed(ElasticError):
    """This member was taken out of the job by the others (they found it silent) while it was still running."""


class TooFewMembers(ElasticError):
    """Fewer members remain than the job's minimum."""


class Diverged(ElasticError):
    """Members that should hold the same training state do not (the step boundary compares their digests)."""


class JoinRefused(ElasticError):
    """A joiner differs from the running job (package or torch version, model, config: fingerprint.py) and was
    refused before it registered; the message names the first differences."""


class Reconfiguring(dist.DistBackendError):
    """A collective was called on the elastic process group while it re-forms: it fails at once, and the step
    it belongs to is dropped on every member."""


def store_failure(member: str, address: str, error: BaseException) -> HostZeroLost:
    """The store operation's `error`, as what it means to this member: host 0 is gone."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return HostZeroLost(member, address, first)


__all__ = ["ElasticError", "HostZeroLost", "Removed", "TooFewMembers", "Diverged", "JoinRefused", "Reconfiguring",
           "HOST_ZERO_MUST_STAY", "store_failure"]
