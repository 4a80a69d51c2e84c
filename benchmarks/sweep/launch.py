"""Where a benchmark's ranks run: N processes on this machine over loopback, or one per host of an emulated
switch (`lightning_mccl.switch`), started and supervised by the launcher's library, `lightning_mccl.launcher`
(a hard timeout; the first failing rank stops the others; every rank's output on stderr, prefixed
``[host rN]``).

    with placement(nproc=4, hosts=4, rate="1gbit") as where:   # builds a throwaway switch, removes it after
        where.run([sys.executable, "worker.py"], env={...}, timeout=600)
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence

from lightning_mccl.launcher import PrefixedOutput, local_plan, supervise, switch_plan
from lightning_mccl.switch import DEFAULT_CONGESTION, SwitchFleet, random_tag


class LaunchFailed(RuntimeError):
    pass


@dataclass
class Placement:
    nproc: int
    fleet: Optional[SwitchFleet] = None
    log: object = None
    _port: int = 29500

    @property
    def ifname(self) -> str:
        return self.fleet.ifname if self.fleet is not None else "lo"

    def link_goodput_gbps(self):
        """GB/s of TCP payload an emulated link carries (None on loopback): busbw's ceiling there."""
        if self.fleet is None:
            return None
        from lightning_mccl.switch.rates import line_rate_goodput

        return line_rate_goodput(self.fleet.rate_bps) / 8 / 1e9

    def describe(self) -> str:
        if self.fleet is None:
            return f"{self.nproc} ranks on this machine over loopback"
        per = self.nproc // self.fleet.hosts
        return f"{self.nproc} ranks on an emulated {self.fleet.describe()}" + (f", {per} per host" if per > 1 else "")

    def run(self, command: Sequence[str], *, env: Dict[str, str], timeout: float) -> None:
        """Runs `command` as every rank; LaunchFailed naming the failing rank if any fails or time runs out;
        SystemExit(128 + N) once the ranks are stopped when this process got signal N (SIGINT, SIGTERM), so that
        a script of several launches ends instead of starting the next."""
        env = {"GLOO_SOCKET_IFNAME": self.ifname, **env}
        if self.fleet is None:
            plan = local_plan(self.nproc, command, env=env, grace=5.0)
        else:
            self._port += 1  # a fresh rendezvous port per launch, inside host 0's namespace
            plan = switch_plan(self.fleet, command, env=env, grace=5.0, master_port=self._port,
                               nproc_per_node=self.nproc // self.fleet.hosts)
        specs = plan.rank_specs()
        log = self.log or (lambda m: sys.stderr.write(m + "\n"))
        outcome = supervise(plan, log=log, output=PrefixedOutput(specs, stream=sys.stderr), fail_fast=True,
                            timeout=timeout)
        if outcome.signal is not None:  # this benchmark was told to stop (Ctrl-C, a budget's timeout): no more launches
            raise SystemExit(128 + outcome.signal)
        if outcome.returncode != 0:
            who = f"rank {outcome.failed.spec.rank} exited with code {outcome.failed.returncode}" \
                if outcome.failed is not None else f"{outcome.reason}, exit code {outcome.returncode}"
            raise LaunchFailed(f"the benchmark ranks failed ({who}); their output is above")

    def run_worker(self, script: str, spec: dict, group, *, timeout: float, mpi: bool = False) -> dict:
        """Writes `spec` next to its "result" path, runs `script --worker SPEC` on every rank with the series'
        environment (`group`), and returns the JSON the workers wrote to spec["result"]."""
        spec_path = spec["result"].replace(".json", ".spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = {}
        for s in group:
            env.update(s.env_dict)
        command = [sys.executable, os.path.abspath(script), "--worker", spec_path]
        (self.run_mpi if mpi else self.run)(command, env=env, timeout=timeout)
        with open(spec["result"]) as f:
            return json.load(f)

    def run_mpi(self, command: Sequence[str], *, env: Dict[str, str], timeout: float) -> None:
        """Runs `command` as every rank through `mpirun` (Open MPI), TCP only, on this placement's interface.
        Loopback only: MPI's own launcher cannot start ranks inside the emulated hosts (yet)."""
        if self.fleet is not None:
            raise ValueError("the mpi4py series runs on loopback only (mpirun cannot place ranks in the emulated "
                             "hosts' namespaces); leave it out with --hosts/--switch")
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise ValueError("mpi4py series: `mpirun` not found (Debian/Ubuntu: apt-get install openmpi-bin)")
        argv = [mpirun, "-np", str(self.nproc), "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
                "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", self.ifname,
                "--mca", "oob_tcp_if_include", self.ifname]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        child_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **env}
        for key in sorted({"OMP_NUM_THREADS", "PYTHONPATH", *env}):
            if key in child_env:
                argv += ["-x", key]
        proc = subprocess.Popen(argv + list(command), stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
                                env=child_env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise LaunchFailed(f"mpirun did not finish within {timeout:g} s: stopped") from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        if code != 0:
            raise LaunchFailed(f"mpirun exited with code {code}; its output is above")


@contextlib.contextmanager
def placement(nproc: int, hosts: Optional[int] = None, rate: str = "1gbit", switch: Optional[str] = None,
              burst: Optional[str] = None, log=None, congestion: Optional[str] = DEFAULT_CONGESTION
              ) -> Iterator[Placement]:
    """Loopback (hosts and switch None); a new switch of `hosts` hosts at `rate`, removed on exit; or the
    running switch tagged `switch`. congestion: the new switch's TCP congestion control ("system": the
    machine's). nproc must be a multiple of the number of hosts."""
    if hosts is None and switch is None:
        yield Placement(nproc, log=log)
        return
    if switch is not None:
        fleet = SwitchFleet.attach(switch)
        _check(nproc, fleet.hosts)
        yield Placement(nproc, fleet, log=log)
        return
    _check(nproc, hosts)
    fleet = SwitchFleet(hosts, rate, tag=random_tag(), burst=burst, congestion=congestion)
    with fleet:
        if log:
            log(f"emulated {fleet.describe()}")
        yield Placement(nproc, fleet, log=log)


def _check(nproc: int, hosts: int) -> None:
    if nproc % hosts:
        raise ValueError(f"--nproc {nproc} does not spread evenly over {hosts} hosts")
