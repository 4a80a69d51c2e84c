"""`mccl launch`: one command, every rank of the fleet.

    mccl launch --hostfile fleet.yaml -- python train.py fit --config vit.yaml
    mccl launch --local 2 -- python train.py fit --config vit.yaml      # 2 ranks on this machine

Host i of the hostfile (see `lightning_mccl.hostfile`) runs ``--nproc-per-node`` ranks (default 1), each
reached by its own ``ssh`` connection (also the host you launch from), in the launcher's working directory
(or ``--chdir``), with torchrun's environment: MASTER_ADDR (host 0's addr), MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (and GROUP_RANK, MCCL_NODE_RANK), plus MCCL_SOCKET_IFNAME from the
host's ``ifname``. ``--local N`` is the same with N "hosts" that are this machine over loopback
(MASTER_ADDR=127.0.0.1, a free port) and no ssh, so ``Trainer(num_nodes=N)`` runs unchanged on one machine
(for ``Trainer(devices=P)`` on one machine, use ``--local 1 --nproc-per-node P``). ``--switch TAG`` runs
host i's ranks inside host i of the emulated switch TAG (`mccl switch up`, Linux and root only): MASTER_ADDR
is host 0's address there and MCCL_SOCKET_IFNAME its interface, so the ranks talk over the shaped links.
Every rank also gets TORCHELASTIC_RUN_ID (one id per job), torchrun's marker, so Lightning reads these
variables through its TorchElasticEnvironment: a ``Trainer(num_nodes=..., devices=...)`` whose product is not
WORLD_SIZE fails at once on every rank, as under torchrun; MCCL_HOSTS (the host names, in node order: the
rendezvous names the hosts of missing ranks with it); and MCCL_CAFFEINATE (``--caffeinate``: on a macOS host
the rank shim runs ``caffeinate -dims -w PID`` for the rank, so the Mac does not sleep during the job).
``--port-range LOW-HIGH`` sets MCCL_PORT_RANGE: the engine's listeners bind only those ports.

What every rank also gets: the launcher's MCCL_* variables (engine tuning such as MCCL_DEBUG; per-host
ones excepted), the ``--env`` variables, PYTHONUNBUFFERED=1 (so output streams as it is printed) unless
set, and, as torchrun does, OMP_NUM_THREADS=1 when several ranks share a machine and it is not set.
These travel in the rank's spec over the rank shim's stdin (through ssh's encrypted channel), never on a
command line: ``ps`` shows every user the argv of the shim and of ssh, and the environment may hold
MCCL_AUTH_SECRET or an API token. On the host, only the rank's own user (and root) can read its environment.
A command that starts with ``python``/``python3`` runs with ``--python`` (default: the launcher's own
interpreter), because a non-interactive ssh shell has no virtual environment activated.

Supervision (see `supervise`): output prefixed ``[host rN]`` on stdout; the first rank to fail stops all
the others and its exit code is the launcher's; Ctrl-C (SIGINT) is forwarded to every rank as SIGINT,
anything still alive ``--grace`` seconds later is killed, and the launcher exits with 130.

Restarts (``--max-restarts N``): when a rank fails, every rank is stopped as above and then all of them
are started again, up to N times; the job resumes from its own checkpoints (e.g. Lightning's
``ckpt_path="last"``). Each attempt rendezvouses afresh: on a new free port with ``--local`` (unless
``--master-port`` is given), else on the same port, which the previous attempt's store released when its
processes ended. Every rank gets MCCL_RESTART_COUNT (0 on the first attempt) and MCCL_MAX_RESTARTS, and
torchrun's names for them, TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS. Ctrl-C, a signal to
the launcher, or a rank that cannot be started at all ends the job without a restart; after the last
restart the launcher exits with the last failing rank's code. Why not torchrun's elastic agent: it needs
an agent started by hand on every Mac and a rendezvous backend between them; `mccl launch` already
controls every host from one command (over ssh), so restarting the whole job from there needs nothing more.
"""
from __future__ import annotations

import argparse
import base64
import os
import re
import shlex
import socket
import sys
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from ..hostfile import Host, Hostfile, HostfileError, load_hostfile
from . import fleet_summary, rank_shim
from ..switch.netns import exec_argv as netns_exec_argv
from .quiet_stop import QuietStop, wants_everything
from .supervise import Outcome, PrefixedOutput, RankSpec, Supervisor

DEFAULT_SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=15 -o ServerAliveCountMax=4"
DEFAULT_GRACE_S = 10.0
LOCAL_ADDR = "127.0.0.1"
LOCAL_HOST_NAME = "local"
# Set per host or per attempt by the launcher, so never copied from the launcher's own environment.
PER_HOST_VARS = ("MCCL_SOCKET_IFNAME", "MCCL_NODE_RANK", "MCCL_RESTART_COUNT", "MCCL_MAX_RESTARTS")
# `python -c` program that runs the rank shim's source, passed (base64) as its first argument.
SHIM_BOOTSTRAP = "import base64,sys;exec(base64.b64decode(sys.argv[1]))"
_SHIM_SOURCE_B64 = base64.b64encode(Path(rank_shim.__file__).read_bytes()).decode("ascii")
_PYTHON_WORD = re.compile(r"python(3(\.\d+)?)?")


class LaunchError(ValueError):
    """Bad input to `mccl launch` / `mccl doctor` (the command exits with code 2)."""


def free_port(addr: str = LOCAL_ADDR) -> int:
    """A TCP port on `addr` that was free a moment ago (the small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def shim_argv(python: str) -> List[str]:
    """The argv that starts the rank shim with `python`. It holds only the shim's own source: the rank's
    spec (its command and environment, MCCL_AUTH_SECRET included) goes to the shim's stdin (`shim_input`),
    never on a command line that `ps` shows to every user of the launching Mac and of the host."""
    return [python, "-c", SHIM_BOOTSTRAP, _SHIM_SOURCE_B64]


def shim_input(*, argv: Sequence[str], cwd: Optional[str], env: Mapping[str, str], label: str,
               grace: float) -> bytes:
    """The first line the launcher writes to a rank shim's stdin: the rank's spec."""
    spec = {"argv": list(argv), "cwd": cwd, "env": dict(env), "label": label, "grace": grace}
    return rank_shim.encode_spec(spec).encode("ascii") + b"\n"


def ssh_argv(ssh: Sequence[str], host: str, remote_argv: Sequence[str]) -> List[str]:
    """`remote_argv` run on `host` through ssh. ``-T``: never a pseudo-terminal (the rank shim reads its
    control lines from a plain pipe), whatever the ssh config says. The remote login shell sees one
    ``exec`` and shell-quoted words (base64 and paths only), which sh, bash, zsh and fish all read alike."""
    return [*ssh, "-T", host, "exec " + " ".join(shlex.quote(a) for a in remote_argv)]


def resolve_command(command: Sequence[str], python: str) -> Tuple[List[str], bool]:
    """`command` with a leading ``python``/``python3``/``python3.X`` replaced by `python`; and whether it was."""
    command = list(command)
    if command and _PYTHON_WORD.fullmatch(command[0]) and command[0] != python:
        return [python] + command[1:], True
    return command, False


@dataclass(frozen=True)
class LaunchPlan:
    """Where and how every rank runs. ``ssh=None``: all hosts are this machine (``--local``), or network
    namespaces of it (``netns``: host i's ranks run in namespace netns[i], see `lightning_mccl.switch`)."""

    hosts: Tuple[Host, ...]
    command: Tuple[str, ...]
    master_port: int
    nproc_per_node: int = 1
    ssh: Optional[Tuple[str, ...]] = None
    python: str = sys.executable
    cwd: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    grace: float = DEFAULT_GRACE_S
    netns: Optional[Tuple[str, ...]] = None
    restart: int = 0  # which attempt this is (0: the first)
    max_restarts: int = 0
    caffeinate: str = "auto"  # the rank shim's MCCL_CAFFEINATE: auto (macOS hosts), on, off
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # one per job, kept by restarts

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.nproc_per_node

    @property
    def master_addr(self) -> str:
        return self.hosts[0].addr

    @property
    def is_local(self) -> bool:
        return self.ssh is None

    def ranks_per_machine(self) -> int:
        return self.world_size if self.is_local else self.nproc_per_node

    def rank_env(self, node_rank: int, local_rank: int, base_env: Optional[Mapping[str, str]] = None) -> dict:
        """The variables rank (node_rank, local_rank) gets on top of its host's environment."""
        base = os.environ if base_env is None else base_env
        rank = node_rank * self.nproc_per_node + local_rank
        env = {k: v for k, v in base.items() if k.startswith("MCCL_") and k not in PER_HOST_VARS}
        env.update(self.env)
        if "PYTHONUNBUFFERED" not in base and "PYTHONUNBUFFERED" not in env:
            env["PYTHONUNBUFFERED"] = "1"
        if self.ranks_per_machine() > 1 and "OMP_NUM_THREADS" not in base and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"
        env.update({
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
            "NODE_RANK": str(node_rank),
            "GROUP_RANK": str(node_rank),
            "MCCL_NODE_RANK": str(node_rank),
            "MCCL_RESTART_COUNT": str(self.restart),
            "MCCL_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            # torchrun's marker: Lightning then picks TorchElasticEnvironment, which reads WORLD_SIZE and RANK
            # and rejects a Trainer(num_nodes x devices) that does not match them (LightningEnvironment,
            # picked otherwise, ignores WORLD_SIZE and waits forever for ranks that were never launched).
            "TORCHELASTIC_RUN_ID": self.run_id,
            "MCCL_HOSTS": ",".join(h.name for h in self.hosts),  # host of rank r: r // LOCAL_WORLD_SIZE
            "MCCL_CAFFEINATE": self.caffeinate,
        })
        ifname = self.hosts[node_rank].ifname
        if ifname:
            env["MCCL_SOCKET_IFNAME"] = ifname
        return env

    def rank_specs(self, base_env: Optional[Mapping[str, str]] = None) -> List[RankSpec]:
        specs = []
        for node_rank, host in enumerate(self.hosts):
            for local_rank in range(self.nproc_per_node):
                rank = node_rank * self.nproc_per_node + local_rank
                spec = shim_input(argv=self.command, cwd=self.cwd, label=f"{host.name} r{rank}",
                                  env=self.rank_env(node_rank, local_rank, base_env), grace=self.grace)
                argv = shim_argv(self.python)
                if self.ssh is not None:
                    argv = ssh_argv(self.ssh, host.name, argv)
                elif self.netns is not None:
                    argv = netns_exec_argv(self.netns[node_rank], argv)
                specs.append(RankSpec(rank=rank, host=host.name, argv=tuple(argv), stdin=spec))
        return specs

    def explain_exit(self, spec: RankSpec, code: int) -> Optional[str]:
        if code == 255 and not self.is_local:
            return f"255 is ssh's own exit code: it could not reach {spec.host}, or lost the connection"
        if code == 127:
            return f"command not found on {spec.host}: check --python and the command"
        if code > 128 and code - 128 < 65:
            try:
                import signal

                return f"killed by {signal.Signals(code - 128).name}"
            except ValueError:
                return None
        return None

    def next_attempt(self, fresh_port: bool) -> "LaunchPlan":
        """The plan of the next attempt after a failure: restart + 1, on a new free port if `fresh_port`."""
        return replace(self, restart=self.restart + 1,
                       master_port=free_port() if fresh_port else self.master_port)

    def describe(self) -> str:
        n = self.world_size
        ranks = f"{n} rank{'s' if n != 1 else ''}"
        if self.netns is not None:
            where = f"on {len(self.hosts)} emulated host{'s' if len(self.hosts) != 1 else ''} × {self.nproc_per_node}"
        elif self.is_local:
            where = "on this machine over loopback"
        else:
            where = f"on {len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''} × {self.nproc_per_node}"
        return f"{ranks} {where} (master {self.master_addr}:{self.master_port})"


def local_plan(num: int, command: Sequence[str], *, master_port: Optional[int] = None, **kwargs) -> LaunchPlan:
    """`num` hosts that are this machine (loopback); port: `master_port` or a free one."""
    if num < 1:
        raise LaunchError(f"--local needs at least 1 rank, got {num}")
    hosts = tuple(Host(name=LOCAL_HOST_NAME, addr=LOCAL_ADDR) for _ in range(num))
    return LaunchPlan(hosts=hosts, command=tuple(command), master_port=master_port or free_port(), **kwargs)


def switch_plan(fleet, command: Sequence[str], *, master_port: Optional[int] = None, **kwargs) -> LaunchPlan:
    """The hosts of an emulated switch (a `lightning_mccl.switch.SwitchFleet` that is up), on this machine.
    Port: `master_port` or 29500 (host 0 is a namespace of its own: only another job on the same switch
    could hold it)."""
    hosts = tuple(Host(name=f"h{i}", addr=fleet.host_ip(i), ifname=fleet.ifname) for i in range(fleet.hosts))
    return LaunchPlan(hosts=hosts, command=tuple(command), master_port=master_port or 29500,
                      netns=tuple(fleet.netns(i) for i in range(fleet.hosts)), **kwargs)


def hostfile_plan(hostfile: Hostfile, command: Sequence[str], *, ssh: Sequence[str] = tuple(shlex.split(DEFAULT_SSH)),
                  master_port: Optional[int] = None, **kwargs) -> LaunchPlan:
    """The hostfile's hosts, each reached with `ssh`; port: `master_port` or the hostfile's."""
    for h in hostfile.hosts:
        if h.name.startswith("-"):
            raise LaunchError(f"{hostfile.path}: host name {h.name!r} starts with '-' (ssh would read it as an option)")
    if not ssh:
        raise LaunchError("--ssh is empty: give the ssh command, e.g. --ssh 'ssh -o BatchMode=yes'")
    return LaunchPlan(hosts=tuple(hostfile.hosts), command=tuple(command), ssh=tuple(ssh),
                      master_port=master_port or hostfile.master_port, **kwargs)


# -- command line ----------------------------------------------------------------------------------------------


def _int_at_least(minimum: int):
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _port_range(text: str) -> str:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = 0
    if not sep or not 1 <= lo <= hi <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port range LOW-HIGH (1 <= LOW <= HIGH <= 65535), "
                                         "e.g. 29600-29700")
    return f"{lo}-{hi}"


def add_fleet_arguments(parser: argparse.ArgumentParser, runs_command: bool = True) -> None:
    """The options `mccl launch` and `mccl doctor` share: which hosts, and how to reach them (doctor, which
    takes no command: `runs_command=False`, --grace hidden)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hostfile", metavar="FILE", help="fleet hostfile (YAML or JSON): the hosts, reached by ssh")
    where.add_argument("--local", metavar="N", type=_positive_int,
                       help="N ranks on this machine over loopback, no ssh (same environment as N hosts)")
    where.add_argument("--switch", metavar="TAG",
                       help="the hosts of the emulated switch TAG on this machine (`mccl switch up`; root)")
    parser.add_argument("--master-port", metavar="PORT", type=_port,
                        help="rendezvous port on host 0 (default: the hostfile's master_port; a free port with --local)")
    parser.add_argument("--chdir", metavar="DIR", help="working directory of every rank (default: this one)")
    parser.add_argument("--python", metavar="PY", default=sys.executable,
                        help=("Python on the hosts, also for a command starting with `python`" if runs_command else
                              "Python on the hosts (the one the ranks will use)") + " (default: %(default)s)")
    parser.add_argument("--ssh", metavar="CMD", default=DEFAULT_SSH,
                        help="ssh command and options (default: %(default)r); -T is always added")
    parser.add_argument("--grace", metavar="S", type=_seconds, default=DEFAULT_GRACE_S,
                        help="seconds ranks get to exit after being asked to stop, before they are killed "
                             "(default: %(default)g)" if runs_command else argparse.SUPPRESS)


EPILOG = """\
every rank gets torchrun's variables: MASTER_ADDR (host 0's addr), MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (= GROUP_RANK = MCCL_NODE_RANK), and MCCL_SOCKET_IFNAME from the
host's ifname; TORCHELASTIC_RUN_ID (Lightning then checks num_nodes x devices against WORLD_SIZE).
--local N acts as N hosts of --nproc-per-node ranks each: Trainer(num_nodes=N) runs unchanged.

output: every line of every rank, prefixed [host rN], on stdout; the launcher's messages on stderr.
exit code: the first failing rank's (the others are stopped at once), 130 after Ctrl-C, 0 when all succeed.
--max-restarts N: after a failure, all ranks start again (up to N times; MCCL_RESTART_COUNT says which
attempt); the exit code is then the last attempt's.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser)
    parser.add_argument("--nproc-per-node", metavar="P", type=_positive_int, default=1,
                        help="ranks per host (default: 1; one Mac, one rank)")
    parser.add_argument("--max-restarts", metavar="N", type=_non_negative_int, default=0,
                        help="when a rank fails, stop all ranks and start them all again, up to N times "
                             "(default: 0); ranks see MCCL_RESTART_COUNT")
    parser.add_argument("--caffeinate", action=argparse.BooleanOptionalAction, default=None,
                        help="keep each host awake while its ranks run (`caffeinate -dims`); default: on for "
                             "macOS hosts, off elsewhere")
    parser.add_argument("--port-range", metavar="LOW-HIGH", type=_port_range,
                        help="the only ports ranks listen on while connecting (sets MCCL_PORT_RANGE; "
                             "e.g. 29600-29700), so a firewall can allow them; default: any free port")
    parser.add_argument("--env", metavar="NAME[=VALUE]", action="append", default=[],
                        help="set NAME for every rank (NAME alone: this shell's value); repeatable")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs, after --")


def parse_env(items: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> dict:
    environ = os.environ if environ is None else environ
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--env {item!r}: {name!r} is not a variable name")
        if not sep:
            if name not in environ:
                raise LaunchError(f"--env {name}: {name} is not set here (use --env {name}=VALUE)")
            value = environ[name]
        out[name] = value
    return out


def plan_from_args(args: argparse.Namespace, command: Sequence[str], *, nproc_per_node: int = 1,
                   env: Optional[Mapping[str, str]] = None) -> LaunchPlan:
    """The plan for parsed `mccl launch`/`mccl doctor` options. Raises LaunchError (or HostfileError)."""
    cwd = os.path.abspath(args.chdir) if args.chdir else os.getcwd()
    common = dict(nproc_per_node=nproc_per_node, python=args.python, cwd=cwd, env=dict(env or {}),
                  grace=args.grace, master_port=args.master_port)
    if args.local is not None or getattr(args, "switch", None) is not None:
        if not os.path.isdir(cwd):
            raise LaunchError(f"--chdir {args.chdir}: no such directory")
        if args.local is not None:
            return local_plan(args.local, command, **common)
        from ..switch import SwitchError, SwitchFleet

        try:
            return switch_plan(SwitchFleet.attach(args.switch), command, **common)
        except (SwitchError, ValueError) as e:
            raise LaunchError(f"--switch {args.switch}: {e}") from None
    try:
        ssh = shlex.split(args.ssh)
    except ValueError as e:
        raise LaunchError(f"--ssh {args.ssh!r}: {e}") from None
    return hostfile_plan(load_hostfile(args.hostfile), command, ssh=ssh, **common)


def supervise(plan: LaunchPlan, *, log, **kwargs) -> Outcome:
    """Runs `plan` under a Supervisor (kwargs: output, fail_fast, timeout)."""
    return Supervisor(plan.rank_specs(), log=log, grace=plan.grace, explain_exit=plan.explain_exit,
                      **kwargs).run()


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    """`mccl launch`: returns the exit code (parser.error exits 2 on bad input)."""
    from .console import make_log, stderr_console

    if command is not None and args.command:
        parser.error("give the command once, after --")
    command = list(command if command is not None else args.command)
    if not command:
        parser.error("missing the command to run, e.g. mccl launch --local 2 -- python train.py")
    try:
        env = {**fleet_summary.rank_env(), **parse_env(args.env)}
        if args.port_range:
            env["MCCL_PORT_RANGE"] = args.port_range
        command, replaced = resolve_command(command, args.python)
        plan = plan_from_args(args, command, nproc_per_node=args.nproc_per_node, env=env)
    except (LaunchError, HostfileError) as e:
        parser.error(str(e))
    caffeinate = {None: "auto", True: "on", False: "off"}[args.caffeinate]
    plan = replace(plan, max_restarts=args.max_restarts, caffeinate=caffeinate)
    log = make_log(stderr_console())
    log(f"launching {plan.describe()}: {shlex.join(plan.command)}")
    if replaced:
        log(f"`python` runs as {plan.python} (see --python)")
    fresh_port = args.local is not None and args.master_port is None
    while True:
        # rank 0's summary line is kept for the end (fleet_summary); after Ctrl-C one line per rank (quiet_stop)
        output = fleet_summary.SummaryTap(PrefixedOutput(plan.rank_specs()))
        outcome = supervise(plan, log=log, output=output if wants_everything() else QuietStop(output))
        if outcome.reason != "failed" or plan.restart >= plan.max_restarts:
            break
        f = outcome.failed
        plan = plan.next_attempt(fresh_port)
        log(f"rank {f.spec.rank} on {f.spec.host} failed with exit code {f.returncode}: restarting all "
            f"{plan.world_size} ranks (restart {plan.restart} of {plan.max_restarts}, master port {plan.master_port})")
    if outcome.reason == "ok":
        log(f"all {plan.world_size} ranks finished" + (f" (after {plan.restart} restart{'s' if plan.restart > 1 else ''})"
                                                       if plan.restart else ""))
    elif outcome.reason == "failed":
        f = outcome.failed
        tail = f" (no restarts left after {plan.restart})" if plan.max_restarts else ""
        log(f"failed: rank {f.spec.rank} on {f.spec.host} exited with code {f.returncode}{tail}")
    else:
        log(f"stopped ({outcome.reason}); exit code {outcome.returncode}")
    if output.text():
        print(output.text(), flush=True)
    return outcome.returncode
