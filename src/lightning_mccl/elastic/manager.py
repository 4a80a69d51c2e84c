"""The elastic manager: one object per process that runs a training loop through membership changes.

The loop it expects (docs/elastic.md has the whole example)::

    while manager.epoch < epochs:
        step = manager.start_step()          # None once this member has left the job
        if step is None:
            break
        loss = loss_of(model(x[step.ids]), y[step.ids])
        loss.backward()                      # DDP over manager.pg, or manager.allreduce(grad) per tensor
        if manager.should_commit():          # every member agrees, or no member applies the step
            optimizer.step()
        optimizer.zero_grad()
    manager.finish()

`start_step` applies the decision of the last step boundary: it re-forms the process group when the membership
changed or the last step failed, sends the training state to the members that lack it (joiners), and deals
the step's global batch (`ElasticSampler`) by the decision's shares (each member's share follows its measured
speed: pace.py). `should_commit` is the step boundary: this member posts whether its step succeeded and its
measured rate, and the others' posts are awaited (membership.py); the decision says whether every member
applies the step (the sampler records its ids in the ledger) or none does (its ids are dealt again, whole, to
the next step's members: the step is dropped and its batch redone). A failed collective never raises from
`allreduce` or the DDP hook: it is reported (`report_error`) and decides the vote.
"""
from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Set, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ..launcher.launch_plan import launched_as_joiner, with_launched_settings
from ..rendezvous import rendezvous
from . import fingerprint, owner, state_transfer
from .board import Board, Pauses
from .errors import Diverged, ElasticError, Removed, TooFewMembers
from .liveness import Heartbeat, Stillness
from .membership import Decision, Membership, Post, member_id
from .owner import OwnerWatch
from .pace import Speedometer, changed_materially
from .process_group import ElasticProcessGroup
from .sampler import Deal, ElasticSampler
from .settings import ElasticSettings

STORE_HOST = member_id(0)  # the launcher's rank 0 serves the Store
# How the engine's errors name the rank they are about (csrc/engine/transport/): its connection closed, it
# sent nothing for the heartbeat timeout, or a collective timed out waiting for it. An error another rank
# reported nests that rank's own message, so the last match names the rank that failed first.
NAMED_RANK = re.compile(r"(?:lost its connection to|heard nothing from|waiting for a message from) rank (\d+)")


@dataclass(frozen=True)
class Step:
    """One step as dealt to this member."""

    index: int  # the committed steps before it: its number if it commits
    epoch: int
    ids: np.ndarray  # this member's sample ids
    deal: Deal  # the whole global batch and every member's slice
    rank: int
    size: int

    @property
    def weight(self) -> float:
        """This member's part of the global batch."""
        return len(self.ids) / len(self.deal.ids) if len(self.deal.ids) else 0.0


class ElasticManager:
    """Membership, the re-forming process group, the vote and the sampler of one member (module docstring).

    `state_dict()` / `load_state_dict(state)`: the user's training state (model and optimizer), sent to the
    members that lack it. `members`: the initial quorum (a joiner passes none). `connect()`: a new client of
    the job's Store (for the heartbeat thread). `config`: the run's settings, a string or anything JSON-able,
    which a joiner must share with the job (fingerprint.py: so must the versions and the model's tensors), or it
    is refused with `JoinRefused`. `fingerprint_of()`: what of the state the fingerprint compares, when not all of
    `state_dict()` (a Lightning checkpoint holds tensors that only a member which trained has, such as a
    callback's best score). `console_user()`: who is logged in at this Mac's screen, which
    `ElasticSettings.leave_when_owner_logs_in` watches (owner.py; a stand-in in the tests)."""

    def __init__(self, store: dist.Store, *, member: str, members: Sequence[str], sampler: ElasticSampler,
                 state_dict: Callable[[], Any], load_state_dict: Callable[[Any], None],
                 connect: Callable[[], dist.Store], address: str, settings: Optional[ElasticSettings] = None,
                 leave_on_sigterm: bool = True, say: Optional[Callable[[str], None]] = None, config: Any = None,
                 fingerprint_of: Optional[Callable[[], Any]] = None,
                 console_user: Callable[[], Optional[str]] = owner.console_user):
        self.settings = settings or ElasticSettings()
        self.sampler = sampler
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self._say = say or (lambda line: print(f"mccl elastic: {line}", file=sys.stderr, flush=True))
        self.board = Board(store, member or "(a joiner)", address)
        fingerprint_of = fingerprint_of or state_dict
        if not members:
            info = {"host": socket.gethostname(), "pid": os.getpid()}
            fingerprint.admit(self.board, fingerprint.of(fingerprint_of, config), info, self.settings.timeout)
            member = self.board.member = Membership.register_joiner(self.board, info)
        elif member == STORE_HOST:
            fingerprint.publish(self.board, fingerprint.of(fingerprint_of, config))
        self.me = member
        self.membership = Membership(self.board, member, self.settings, members, STORE_HOST, self._say,
                                     global_batch=sampler.global_batch)
        self.speed = Speedometer(self.settings.pace_smoothing, self.settings.pace_after_steps)
        self.pg = ElasticProcessGroup(store, timeout=self.settings.group_timeout,
                                      settings=self.settings.group_settings(), route_to=address.rsplit(":", 1)[0],
                                      report=self.report_error)
        self.heartbeat = Heartbeat(connect, self.me, address, self.settings.heartbeat_s)
        self.heartbeat.start()
        self.owner = OwnerWatch(console_user, self.request_leave, self.settings.owner_poll_s)
        if self.settings.leave_when_owner_logs_in:
            self.owner.start()
        # Stopped before the interpreter finalizes: a daemon thread still inside a Store call then would end
        # the process with std::terminate.
        atexit.register(self.close)
        self.step = 0  # committed steps
        self.has_state = self.me == STORE_HOST
        self.left = False
        self._decision: Optional[Decision] = None
        self._members: Sequence[str] = ()  # the quorum of the group now formed (rank order)
        self._shares_said: Tuple[Tuple[str, ...], Tuple[int, ...]] = ((), ())  # the last share line's members, shares
        self._step: Optional[Step] = None
        self._error: Optional[str] = None
        self._suspects: Set[str] = set()
        self._lock = threading.Lock()
        self._leave = ""
        self._old_sigterm = None
        if leave_on_sigterm and threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, lambda *_: self.request_leave("it got SIGTERM"))

    @classmethod
    def from_env(cls, sampler: ElasticSampler, state_dict: Callable[[], Any], load_state_dict: Callable[[Any], None],
                 *, join: bool = False, settings: Optional[ElasticSettings] = None, **kwargs) -> "ElasticManager":
        """A member started by a launcher (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: every initial member
        waits at the rendezvous for all of them), or with `join=True` a process joining a running job. What
        `mccl launch --elastic` and `mccl join` say win: the minimum of members, leaving when the owner logs in,
        and joining (launch_plan).
        `kwargs` go to the constructor (`config`, `say`, `leave_on_sigterm`, `fingerprint_of`, `console_user`)."""
        settings, join = with_launched_settings(settings or ElasticSettings()), join or launched_as_joiner()
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        timeout = settings.group_timeout

        def connect() -> dist.Store:
            return dist.TCPStore(addr, port, None, False, timeout, wait_for_workers=False)

        if join:
            try:
                store = connect()
            except dist.DistError as e:
                raise ElasticError(
                    f"mccl elastic: this joiner cannot reach the job's Store on host 0 at {addr}:{port} "
                    f"(MASTER_ADDR:MASTER_PORT) within {settings.timeout:g} s (the elastic timeout): "
                    f"{str(e).splitlines()[0].rstrip('.')}. Is the job running, with its host 0 at that address and "
                    f"port? Or does a firewall on host 0 block the port (macOS: System Settings > Network > "
                    f"Firewall)?") from None
            return cls(store, member="", members=(), sampler=sampler, state_dict=state_dict,
                       load_state_dict=load_state_dict, connect=connect, address=f"{addr}:{port}", settings=settings,
                       **kwargs)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = rendezvous(addr, port, rank, world, timeout)
        return cls(store, member=member_id(rank), members=[member_id(r) for r in range(world)], sampler=sampler,
                   state_dict=state_dict, load_state_dict=load_state_dict, connect=connect, address=f"{addr}:{port}",
                   settings=settings, **kwargs)

    # ---- the loop ------------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next step belongs to (the sampler moves on to it when that step is dealt)."""
        return self.sampler.epoch + 1 if self.sampler.epoch_done else self.sampler.epoch

    @property
    def decision(self) -> Optional[Decision]:
        """The latest step boundary's decision."""
        return self._decision

    @property
    def members(self) -> Sequence[str]:
        """The members of the group now formed, in rank order: those that trained the current (or the last) step;
        empty before the first step."""
        return self._members

    @property
    def leave_requested(self) -> bool:
        return bool(self._leave)

    def start_step(self) -> Optional[Step]:
        """Apply the last boundary's decision and deal this step; None once this member has left the job."""
        while True:
            if self._decision is None:  # the first step: round 0 (a joiner: the round it is admitted at)
                if not self.membership.members:
                    self.membership.catch_up()
                self._decision = self._boundary()
            decision = self._decision
            if not self._admitted(decision):
                if self.left:
                    return None
                self._decision = None  # a joiner not admitted yet: the next round
                continue
            if self.sampler.epoch_done:
                self.sampler.next_epoch()
            if decision.reform and not self._reform(decision):
                # Forming the group or sending the state failed (reported): this step fails at the boundary
                # the others reach after theirs, with the same deal in flight, so every sampler drops it alike.
                self.sampler.deal(decision.members, decision.shares)
                self._decision = self._boundary()
                self.sampler.drop()
                continue
            deal = self.sampler.deal(decision.members, decision.shares)
            rank = decision.rank_of(self.me)
            self._step = Step(self.step, deal.epoch, deal.of(self.me), deal, rank, len(decision.members))
            self.speed.start()
            return self._step

    def should_commit(self) -> bool:
        """The step boundary: True when every member's step succeeded (apply the optimizer step), else False
        (no member applies it; its ids are dealt again)."""
        if self._step is None:
            raise RuntimeError("ElasticManager.should_commit: no step was started (call start_step first)")
        self.speed.stop(len(self._step.ids), ok=self._error is None)
        decision = self._boundary()
        if decision.commit:
            self.sampler.commit(self.step)
            self.step += 1
        else:
            self.sampler.drop()
        self._step = None
        self._decision = decision
        return decision.commit

    # ---- collectives and errors ----------------------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Sum over the members of each one's `tensor` weighted by its part of the global batch (the average
        when the parts are equal), in place. Never raises: a failure is reported and fails the step's vote."""
        step = self._step
        if step is None:
            raise RuntimeError("ElasticManager.allreduce: no step was started (call start_step first)")
        if self._error is not None:
            return _done(tensor)
        if step.weight == 0:
            tensor.zero_()  # no samples: its gradient may be NaN (the mean of nothing)
        else:
            tensor.mul_(step.weight * step.size)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.AVG  # divides by the quorum's size
        self.speed.issued()
        try:
            work = self.pg.allreduce([tensor], opts)  # its failure is reported (the group's `report`)
        except dist.DistError as e:  # Reconfiguring: the group is not formed
            self.report_error(e)
            return _done(tensor)
        return work.get_future().then(lambda _: self._completed(tensor))

    def _completed(self, tensor: torch.Tensor) -> torch.Tensor:
        self.speed.completed()
        return tensor

    def report_error(self, error: BaseException) -> None:
        """The step failed here (`error`): its vote is no. Ranks the engine's message names are suspects."""
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        with self._lock:
            if self._error is None:
                self._error = text
            named = NAMED_RANK.findall(str(error))
            if named and int(named[-1]) < len(self._members):  # the innermost cause: the first rank to fail
                suspect = self._members[int(named[-1])]
                if suspect != self.me:
                    self._suspects.add(suspect)

    def request_leave(self, why: str = "it asked to leave") -> None:
        """Leave at the next step boundary (after this step commits or is dropped), saying `why` in the members'
        line. Safe in a signal handler and from another thread."""
        self._leave = why

    # ---- the step boundary ---------------------------------------------------------------------------------

    def _boundary(self) -> Decision:
        if self.heartbeat.error is not None:
            raise self.heartbeat.error
        with self._lock:
            post = Post(ok=self._error is None, why=self._error or "", leaving=self._leave,
                        has_state=self.has_state, digest=self._digest() if self.has_state else "",
                        suspects=tuple(sorted(self._suspects)), rate=self.speed.rate)
            self._error, self._suspects = None, set()
        return self.membership.boundary(post)

    def _digest(self) -> str:
        return f"{self.step}:{self.sampler.digest()}"

    def _admitted(self, decision: Decision) -> bool:
        """Take the decision's membership: False if this member is not in it (left, or a joiner not yet)."""
        if decision.end:
            raise (TooFewMembers if decision.too_few else Diverged)(
                f"mccl elastic: the job ends at step {self.step} (round {decision.round}): {decision.end}")
        if self.me in decision.members:
            self._announce(decision)
            self._announce_shares(decision)
            return True
        if self.me in decision.left:
            self._say(f"member {self.me} left the job at step {self.step}, as asked ({decision.removed[self.me]})")
            self.left = True
            self.close()
        elif self.me in decision.removed:
            self.close()
            raise Removed(f"mccl elastic: member {self.me} was taken out of the job at round {decision.round} while "
                          f"still running: the others found that {decision.removed[self.me]}")
        return False

    def _announce(self, decision: Decision) -> None:
        """One line per membership change, from the new quorum's first member."""
        joined = [m for m in decision.members if m not in self._members]
        if decision.members[0] != self.me or not (decision.removed or (joined and self._members)):
            return
        parts = [f"{m} left ({why})" for m, why in decision.removed.items()] + [f"{m} joined" for m in joined]
        self._say(f"step {self.step}: {', '.join(parts)}; {len(decision.members)} members now: "
                  f"{', '.join(decision.members)}")

    def _announce_shares(self, decision: Decision) -> None:
        """One line when the shares changed materially (pace.py), from the quorum's first member."""
        if decision.members[0] != self.me or not changed_materially(self._shares_said, decision.members,
                                                                    decision.shares):
            return
        self._shares_said = (decision.members, decision.shares)
        shares = ", ".join(f"{m} {n}" for m, n in zip(decision.members, decision.shares))
        rates = ", ".join(f"{m} {r:.1f}" if r > 0 else f"{m} not measured yet"
                          for m, r in zip(decision.members, decision.rates))
        self._say(f"step {self.step}: shares by speed {shares} of {sum(decision.shares)} (samples/s {rates})")

    def _reform(self, decision: Decision) -> bool:
        """Form the decision's group and send the state to its receivers; False (reported) if that failed."""
        try:
            self.pg.configure(decision.round, decision.rank_of(self.me), len(decision.members))
            self._members = decision.members
            state_transfer.transfer(self.pg.backend, decision.members, decision.receivers, self.me, self._payload,
                                    self._load)
            return True
        except dist.DistError as e:  # a member gone while the group formed or the state travelled; Reconfiguring
            self.report_error(e)
            self.pg.abort(f"forming quorum {decision.round} failed: {str(e).splitlines()[0]}")
            return False

    def state_dict(self) -> dict:
        """The manager's part of a checkpoint, taken between steps: the sampler's state (epoch, position, ids to
        deal again, the epoch's ledger) and the committed steps. It does not depend on the number of members."""
        return {"sampler": self.sampler.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()`, on any number of members (call it on every member before the first step)."""
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])

    def _payload(self) -> dict:
        return {"user": self._state_dict(), "manager": self.state_dict(), "rng": state_transfer.rng_states()}

    def _load(self, payload: dict) -> None:
        self._load_state_dict(payload["user"])
        self.load_state_dict(payload["manager"])
        state_transfer.set_rng_states(payload["rng"])
        self.has_state = True

    # ---- the end ---------------------------------------------------------------------------------------------

    def __enter__(self) -> "ElasticManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def finish(self) -> None:
        """The end of training for every member: host 0 (which serves the Store) waits until the others are
        done with it; then close()."""
        if not self.left:
            self.board.set(f"done/{self.me}", self.step)
            if self.me == STORE_HOST:
                self._await_done([m for m in self._members if m != self.me])
        self.close()

    def _await_done(self, others: Sequence[str]) -> None:
        """Until each of `others` is done, or its heartbeat has been still for silent_after_s, or the timeout."""
        stillness = Stillness(self.board)
        deadline = time.monotonic() + self.settings.timeout
        pauses = Pauses()
        while others and time.monotonic() < deadline:
            others = [m for m in others if not self.board.has([f"done/{m}"])
                      and stillness.still_for(m) < self.settings.silent_after_s]
            pauses.sleep()

    def close(self) -> None:
        """Stop the heartbeat and the group (also at exit, and when a `with` block ends)."""
        atexit.unregister(self.close)
        self.heartbeat.stop()
        self.owner.stop()
        self.pg.abort("the manager was closed")
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _done(tensor: torch.Tensor) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


__all__ = ["ElasticManager", "Step", "STORE_HOST"]
