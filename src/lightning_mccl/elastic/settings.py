"""How long an elastic job waits, and for what: every duration of the membership protocol, declared once.

How a failure is noticed (docs/elastic.md, *Noticing*):

- a member that exits, crashes or is killed closes its sockets: the collective in flight fails at once on every
  member with the engine's connection error, which names it; at the step boundary the others wait for it only
  `suspect_grace_s` (its Store heartbeat must also have stopped for that long), then go on without it;
- a member that stops without closing (asleep, cable pulled, SIGSTOP): the elastic group's engine heartbeat
  (`engine_heartbeat_s`, the group's MCCL_HEARTBEAT_TIMEOUT) fails the collective in flight, naming it;
- a member that is silent between collectives: its Store heartbeat (one counter bumped every `heartbeat_s`)
  has not moved for `silent_after_s` at the step boundary;
- a member whose heartbeat goes on but which never reaches the boundary: `timeout`.

And how each member's share of the global batch follows its measured speed (pace.py; docs/elastic.md, *Pace by
speed*): `pace` turns it on, `pace_smoothing` is the weight of the newest step in a member's rate,
`pace_min_share` the least share a member gets as a fraction of an equal share, `pace_after_steps` how many
steps a member measures before its rate counts.

And whether a member leaves when someone logs in at its Mac's screen (owner.py): `leave_when_owner_logs_in`
(off by default; `mccl launch --elastic --leave-on-login` turns it on), looked at every `owner_poll_s`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta


@dataclass(frozen=True)
class ElasticSettings:
    """The elastic job's durations, in seconds, and its pacing; see the module docstring."""

    timeout: float = 60.0  # collectives of the elastic group, building it, and a live member late at a boundary
    heartbeat_s: float = 0.1  # each member bumps its Store heartbeat this often
    silent_after_s: float = 3.0  # a member whose heartbeat did not move for this long is gone
    suspect_grace_s: float = 0.5  # the same for a member an engine error named (its connection closed)
    engine_heartbeat_s: float = 10.0  # the elastic group's MCCL_HEARTBEAT_TIMEOUT
    min_members: int = 1  # fewer members than this end the job (TooFewMembers)
    pace: bool = True  # each member's share of the global batch follows its measured samples/s
    pace_smoothing: float = 0.5  # the weight of the newest step in a member's rate (a moving average)
    pace_min_share: float = 0.25  # the least share of a member, as a fraction of an equal share
    pace_after_steps: int = 3  # the steps a member measures before its rate counts
    leave_when_owner_logs_in: bool = False  # a member leaves when someone logs in at its Mac's screen (owner.py)
    owner_poll_s: float = 5.0  # how often it looks

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise ValueError(f"ElasticSettings.{f.name}={value!r} must be True or False")
            elif not value > 0:
                raise ValueError(f"ElasticSettings.{f.name}={value!r} must be positive")
        if self.pace_smoothing > 1:
            raise ValueError(f"ElasticSettings: pace_smoothing={self.pace_smoothing} must be at most 1 (the weight "
                             f"of the newest step in a member's rate)")
        if self.pace_min_share >= 1:
            raise ValueError(f"ElasticSettings: pace_min_share={self.pace_min_share} must be less than 1 (a fraction "
                             f"of an equal share; pace=False deals equal shares)")
        if not isinstance(self.pace_after_steps, int):
            raise ValueError(f"ElasticSettings.pace_after_steps={self.pace_after_steps!r} must be a whole number")
        if self.heartbeat_s * 4 > self.suspect_grace_s:
            raise ValueError(f"ElasticSettings: heartbeat_s={self.heartbeat_s} must be at most a quarter of "
                             f"suspect_grace_s={self.suspect_grace_s} (a live member beats at least 4 times in it)")
        if self.suspect_grace_s > self.silent_after_s:
            raise ValueError(f"ElasticSettings: suspect_grace_s={self.suspect_grace_s} is longer than "
                             f"silent_after_s={self.silent_after_s}")

    @property
    def group_timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout)

    def group_settings(self) -> dict:
        """The elastic group's own engine settings (its pg settings, never the environment)."""
        return {"MCCL_HEARTBEAT_TIMEOUT": f"{self.engine_heartbeat_s:g}",
                "MCCL_HEARTBEAT_INTERVAL": f"{min(1.0, self.engine_heartbeat_s / 4):g}"}


__all__ = ["ElasticSettings"]
