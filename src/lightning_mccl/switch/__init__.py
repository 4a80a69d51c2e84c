"""An emulated Ethernet switch for planning a fleet: hosts as Linux network namespaces on a bridge, each link
rate-limited in both directions with tc (see `fleet`). Linux only; needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).

    mccl switch up --hosts 4 --rate 1gbit       # or SwitchFleet(4, "1gbit") in Python
"""
from . import rates
from .fleet import DEFAULT_CONGESTION, DEFAULT_TAG, IFNAME, SwitchFleet, random_tag
from .netns import SwitchError, privilege_problem
from .probe import ProbeResult, measure_goodput

__all__ = ["SwitchFleet", "SwitchError", "rates", "DEFAULT_CONGESTION", "DEFAULT_TAG", "IFNAME", "random_tag", "privilege_problem",
           "measure_goodput", "ProbeResult"]
