"""Process supervision shared by `mccl launch --local`, `mccl launch --hostfile` (over ssh), `mccl doctor` and
the benchmarks (`supervise(plan)` runs a `LaunchPlan`).

A `Supervisor` starts one local process per rank (the rank shim itself for ``--local``, an ``ssh`` client
running the shim on the remote host otherwise: only the argv differs), and then, in one loop:

- streams each rank's output (stdout and stderr merged, in order) line by line, prefixed with
  ``[host rN]``, to this process's stdout, and a progress bar's redraws (pieces ended by a carriage return)
  to the output's `update` (see `progress`);
- notices the first rank that exits with a non-zero code and stops all the others (``fail_fast``);
- on SIGINT / SIGTERM / SIGHUP sends INT (for SIGINT) or TERM to every rank; a second signal kills them;
- escalates to KILL when ranks are still running ``grace`` seconds after being asked to stop;
- reports the outcome: the first failure's exit code, 128 + N after signal N, 124 after ``timeout``;
- starts the ranks ``more()`` returns while it runs and stops nothing (an elastic job's hosts that come back).

Ranks are controlled only through their stdin (see `rank_shim`): the launcher writes ``INT``, ``TERM`` or
``KILL``, and closing it (or this process dying, however it dies) makes the shim terminate the rank. Every
rank's local process runs in its own session, so a Ctrl-C typed in the terminal reaches only the launcher,
which forwards it once, to every rank alike.

`run` starts from scratch each time it is called: a job with restarts (`job`) calls it again (with a new
set of ranks) after a failure. `_on_exit` sees every rank exit in the order they happen.
"""
from __future__ import annotations

import os
import selectors
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from .prefixed_output import PrefixedOutput
from .rank_process import RankSpec, RankProcess


@dataclass(frozen=True)
class RankExit:
    spec: RankSpec
    returncode: Optional[int]  # None: never started, or still running when the launcher gave up on it
    stopped: bool  # the launcher had asked it to stop before it exited


@dataclass(frozen=True)
class Outcome:
    """returncode: 0, the first failing rank's exit code, 128 + N after signal N, 124 after the timeout, or
    127/126 when a rank's local process could not be started. reason: ok, failed, signal, timeout, start.
    signal: the signal that also came (SIGINT, SIGTERM, SIGHUP), also when a failure came first."""

    returncode: int
    reason: str
    exits: tuple
    failed: Optional[RankExit] = None
    signal: Optional[int] = None


class Supervisor:
    """Runs `ranks` to completion; see the module docstring. `output` gets every line (default:
    `PrefixedOutput` on stdout); `log(message)` gets the launcher's own messages (default: stderr);
    `explain_exit(spec, code)` may add a hint to a failure message (e.g. what ssh's 255 means)."""

    POLL_S = 0.1
    FORCE_S = 3.0  # after KILL: how long a rank's local process gets before it is SIGKILLed itself
    DRAIN_S = 2.0  # after the last exit: how long to wait for the rest of the output

    def __init__(
        self,
        ranks: Sequence[RankSpec],
        *,
        output=None,
        log: Optional[Callable[[str], None]] = None,
        grace: float = 10.0,
        fail_fast: bool = True,
        timeout: Optional[float] = None,
        explain_exit: Optional[Callable[[RankSpec, int], Optional[str]]] = None,
        more: Optional[Callable[[], Sequence[RankSpec]]] = None,
    ):
        ranks = list(ranks)
        if not ranks:
            raise ValueError("Supervisor needs at least one rank")
        if len({s.rank for s in ranks}) != len(ranks):
            raise ValueError("Supervisor: ranks must be distinct")
        self.specs = ranks
        self.output = output if output is not None else PrefixedOutput(ranks)
        self.log = log if log is not None else _stderr_log
        self.grace = float(grace)
        self.fail_fast = fail_fast
        self.timeout = timeout
        self.explain_exit = explain_exit
        self.more = more

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        self._ranks = [RankProcess(s) for s in self.specs]
        self._selector = selectors.DefaultSelector()
        self._signals: List[int] = []
        self._signal: Optional[int] = None
        self._failure: Optional[RankProcess] = None
        self._start_error: Optional[int] = None
        self._timed_out = False
        self._stop_reason: Optional[str] = None
        self._kill_at: Optional[float] = None
        self._force_at: Optional[float] = None
        self._t0 = time.monotonic()
        try:
            with self._catch_signals():
                self._start_all()
                while any(r.running for r in self._ranks):
                    self._pump(self.POLL_S)
                    self._reap()
                    self._handle_signals()
                    self._check_deadlines()
                    self._start_more()
                self._handle_signals()  # one that came before any rank started
                self._drain()
                self._output_hook("finish")
        finally:
            for r in self._ranks:  # only reached with live ranks when this loop itself failed
                if r.running:
                    r.control("KILL")
                    r.close_control()
            self._selector.close()
        return self._outcome()

    def _start_all(self) -> None:
        for r in self._ranks:
            if self._signals or not self._start(r):
                break

    def _start(self, r: RankProcess) -> bool:
        try:
            r.start()
        except OSError as e:
            self._start_error = 127 if isinstance(e, FileNotFoundError) else 126
            self.log(f"cannot start rank {r.spec.rank} on {r.spec.host}: {e}")
            self._stop("TERM", "a rank could not be started")
            return False
        self._selector.register(r.proc.stdout, selectors.EVENT_READ, r)
        return True

    def _start_more(self) -> None:
        if self.more is None or self._stop_reason is not None or self._signals:
            return
        for spec in self.more():
            r = RankProcess(spec)
            self._ranks.append(r)
            if not self._start(r):
                return

    def _pump(self, timeout: float) -> None:
        for key, _ in self._selector.select(timeout):
            r: RankProcess = key.data
            try:
                data = os.read(key.fd, 1 << 16)
            except OSError:
                data = b""
            if data:
                self._emit(r, r.split_marked(data))
                continue
            self._close_output(r)
            # End of output: the rank's local process is exiting. Collecting it here, in the order the
            # ends arrive, is what makes "the first failure" the rank that died first, not the lowest rank.
            if r.running and r.poll(wait=0.5) is not None:
                self._on_exit(r)
        self._flush()

    def _emit(self, r: RankProcess, pieces) -> None:
        """A rank's lines to output.line; its redraws (progress bars) to output.update when the output has
        one (else they are lines), the one still being written included, each new state once."""
        update = getattr(self.output, "update", None)
        for text, redraw in pieces:
            if redraw and update is not None:
                if text != r.last_update:
                    update(r.spec, text)
                r.last_update = text
            else:
                if r.last_update and text.startswith(r.last_update) and text != r.last_update:
                    text = text[len(r.last_update):]  # a redraw being written, then someone else's write
                self.output.line(r.spec, text)
                r.last_update = None
        tail = r.pending_redraw() if update is not None else None
        if tail is not None and tail != r.last_update:
            update(r.spec, tail)
            r.last_update = tail

    def _close_output(self, r: RankProcess) -> None:
        if not r.reading:
            return
        self._emit(r, r.split_marked(b"", final=True))
        self._selector.unregister(r.proc.stdout)
        r.proc.stdout.close()
        r.reading = False

    def _reap(self) -> None:
        for r in self._ranks:
            if r.running and r.poll() is not None:
                self._on_exit(r)

    def _on_exit(self, r: RankProcess) -> None:
        """Called once per rank exit, in the order the exits were seen."""
        r.close_control()
        code = r.code
        self._output_hook("rank_exited", r.spec, code)
        if code == 0:
            return
        stopping = self._stop_reason is not None
        if r.stopped or stopping:
            self._output_hook("rank_stopped", r.spec, code)
            return
        hint = self.explain_exit(r.spec, code) if self.explain_exit else None
        message = f"rank {r.spec.rank} on {r.spec.host} exited with code {code}" + (f" ({hint})" if hint else "")
        if self._failure is None:
            self._failure = r
        others = [o for o in self._ranks if o.running]
        if self.fail_fast and others:
            self.log(f"{message}; stopping the other {len(others)} rank{'s' if len(others) > 1 else ''}")
            self._output_hook("begin_stop", r.spec)
            self._stop("TERM", f"rank {r.spec.rank} failed")
        else:
            self.log(message)

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            name = signal.Signals(signum).name
            if self._signal is None:
                self._signal = signum
            if self._stop_reason is None:
                self.log(f"received {name}: stopping all ranks (send it again to kill them at once)")
                self._output_hook("begin_stop")
                self._stop("INT" if signum == signal.SIGINT else "TERM", f"received {name}")
            elif self._force_at is None:
                self.log(f"received {name} while stopping: killing all ranks")
                self._kill()

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if self.timeout is not None and self._stop_reason is None and now - self._t0 > self.timeout:
            self._timed_out = True
            self.log(f"the ranks did not finish within {self.timeout:g} s: stopping them")
            self._stop("TERM", "timeout")
        if self._kill_at is not None and self._force_at is None and now >= self._kill_at:
            left = [r.spec.rank for r in self._ranks if r.running]
            self.log(f"ranks {left} still running {self.grace:g} s after being asked to stop: killing them")
            self._kill()
        if self._force_at is not None and now >= self._force_at:
            for r in self._ranks:
                if r.running and not r.forced:
                    self.log(f"rank {r.spec.rank} on {r.spec.host} ignored KILL: killing its local process")
                    r.force_kill()

    def _stop(self, word: str, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
            self._kill_at = time.monotonic() + self.grace
        for r in self._ranks:
            if r.running:
                r.stopped = True
                r.control(word)

    def _kill(self) -> None:
        if self._stop_reason is None:
            self._stop_reason = "killed"
        self._force_at = time.monotonic() + self.FORCE_S
        for r in self._ranks:
            if r.running:
                r.stopped = True
                r.control("KILL")
                r.close_control()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.DRAIN_S
        while any(r.reading for r in self._ranks) and time.monotonic() < deadline:
            self._pump(min(self.POLL_S, max(0.0, deadline - time.monotonic())))
        for r in self._ranks:  # held open by something the rank left behind: give up on the rest
            self._close_output(r)
        self._flush()

    def _flush(self) -> None:
        self._output_hook("flush")

    def _output_hook(self, name: str, *args) -> None:
        """Calls output.<name>(*args) when the output has it: flush; begin_stop (a signal, or `failed`: the
        spec of the rank whose failure stops the others), rank_stopped (`quiet_stop`); rank_exited (every exit,
        in order), finish (after the last output: `same_lines`)."""
        hook = getattr(self.output, name, None)
        if hook is not None:
            hook(*args)

    def _outcome(self) -> Outcome:
        exits = tuple(RankExit(r.spec, r.code, r.stopped) for r in self._ranks)
        failed = None
        if self._failure is not None:
            failed = RankExit(self._failure.spec, self._failure.code, False)
        if self._start_error is not None:
            return Outcome(self._start_error, "start", exits, failed)
        if failed is not None:
            return Outcome(failed.returncode, "failed", exits, failed, self._signal)
        if self._signal is not None:
            return Outcome(128 + self._signal, "signal", exits, signal=self._signal)
        if self._timed_out:
            return Outcome(124, "timeout", exits)
        return Outcome(0, "ok", exits)

    @contextmanager
    def _catch_signals(self):
        """SIGINT/SIGTERM/SIGHUP are queued for the loop while it runs (main thread only)."""
        saved = {}
        try:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                try:
                    saved[signum] = signal.signal(signum, lambda n, f: self._signals.append(n))
                except ValueError:  # not the main thread: the caller handles signals
                    break
            yield
        finally:
            for signum, handler in saved.items():
                signal.signal(signum, handler)


def supervise(plan, *, log: Optional[Callable[[str], None]] = None, **kwargs) -> Outcome:
    """Runs every rank of `plan` (a `LaunchPlan`) under a Supervisor with the plan's grace and exit hints;
    kwargs: output, fail_fast, timeout, more."""
    return Supervisor(plan.rank_specs(), log=log, grace=plan.grace, explain_exit=plan.explain_exit, **kwargs).run()


def _stderr_log(message: str) -> None:
    sys.stderr.write(f"mccl: {message}\n")
    sys.stderr.flush()
