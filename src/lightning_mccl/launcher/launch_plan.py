"""Where and how every rank of `mccl launch` (and `mccl doctor`) runs: the `LaunchPlan` (the hosts, the
command, the rendezvous port, each rank's environment and the argv that starts it: the rank shim, reached
over ssh or inside a network namespace) and the plans for ``--local``, ``--switch`` and ``--hostfile``
(`fleet_plan` picks one, as the commands' options say). What the launcher does with a plan is described in
`job`; `supervisor` runs it."""
from __future__ import annotations

import base64
import os
import re
import shlex
import socket
import sys
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple, TypeVar

from ..hostfile import Host, Hostfile, check_addresses, load_hostfile
from ..switch.netns import exec_argv as netns_exec_argv
from . import rank_shim
from .rank_process import RankSpec

DEFAULT_SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=15 -o ServerAliveCountMax=4"
DEFAULT_GRACE_S = 10.0
LOCAL_ADDR = "127.0.0.1"
LOCAL_HOST_NAME = "local"
# What an elastic job's ranks get (`elastic`; read by `ElasticManager.from_env` through `with_launched_settings`
# and `launched_as_joiner`): MCCL_ELASTIC=1; the fewest members the job goes on with (--min-nodes K times the ranks
# of a node), only when --min-nodes is given; MCCL_ELASTIC_LEAVE_ON_LOGIN=1 with --leave-on-login;
# MCCL_ELASTIC_JOIN=1 for a rank `mccl join` starts.
ELASTIC_VAR = "MCCL_ELASTIC"
MIN_MEMBERS_VAR = "MCCL_ELASTIC_MIN_MEMBERS"
LEAVE_ON_LOGIN_VAR = "MCCL_ELASTIC_LEAVE_ON_LOGIN"
JOIN_VAR = "MCCL_ELASTIC_JOIN"
ELASTIC_VARS = (ELASTIC_VAR, MIN_MEMBERS_VAR, LEAVE_ON_LOGIN_VAR, JOIN_VAR)
# Set per host, per attempt or per job by the launcher, so never copied from the launcher's own environment.
PER_HOST_VARS = ("MCCL_SOCKET_IFNAME", "MCCL_NODE_RANK", "MCCL_RESTART_COUNT", "MCCL_MAX_RESTARTS", *ELASTIC_VARS)
# `python -c` program that runs the rank shim's source, passed (base64) as its first argument.
SHIM_BOOTSTRAP = "import base64,sys;exec(base64.b64decode(sys.argv[1]))"
_PYTHON_WORD = re.compile(r"python(3(\.\d+)?)?")
Settings = TypeVar("Settings")


class LaunchError(ValueError):
    """Bad input to `mccl launch` / `mccl doctor` (the command exits with code 2)."""


def free_port(addr: str = LOCAL_ADDR) -> int:
    """A TCP port on `addr` that was free a moment ago (the small race is accepted): the launcher's ``--local``
    rendezvous, and every test's and benchmark's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def shim_argv(python: str, source_b64: Optional[str] = None) -> List[str]:
    """The argv that starts the rank shim with `python`. It holds only the shim's own source (base64; read
    from its file unless given): the rank's spec (its command and environment, MCCL_AUTH_SECRET included)
    goes to the shim's stdin (`shim_input`), never on a command line that `ps` shows to every user of the
    launching Mac and of the host."""
    if source_b64 is None:
        source_b64 = base64.b64encode(Path(rank_shim.__file__).read_bytes()).decode("ascii")
    return [python, "-c", SHIM_BOOTSTRAP, source_b64]


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
    namespaces of it (``netns``: host i's ranks run in namespace netns[i], see `lightning_mccl.switch`).
    ``env`` (the ``--env`` variables, maybe an API token) is left out of the repr. ``elastic``: the ranks go on
    when one exits (`elastic`), and go on with at least ``min_members`` (None: the elastic layer's default); with
    ``leave_on_login`` a rank leaves when someone logs in at its Mac's screen;
    ``joining``: only that host's ranks run, joining the running job (`mccl join`)."""

    hosts: Tuple[Host, ...]
    command: Tuple[str, ...]
    master_port: int
    nproc_per_node: int = 1
    ssh: Optional[Tuple[str, ...]] = None
    python: str = sys.executable
    cwd: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    grace: float = DEFAULT_GRACE_S
    netns: Optional[Tuple[str, ...]] = None
    restart: int = 0  # which attempt this is (0: the first)
    max_restarts: int = 0
    caffeinate: str = "auto"  # the rank shim's MCCL_CAFFEINATE: auto (macOS hosts), on, off
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # one per job, kept by restarts
    elastic: bool = False
    min_members: Optional[int] = None
    leave_on_login: bool = False
    joining: Optional[str] = None

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
        if self.elastic:
            env[ELASTIC_VAR] = "1"
            if self.min_members is not None:
                env[MIN_MEMBERS_VAR] = str(self.min_members)
            if self.leave_on_login:
                env[LEAVE_ON_LOGIN_VAR] = "1"
            if self.joining is not None:
                env[JOIN_VAR] = "1"
        ifname = self.hosts[node_rank].ifname
        if ifname:
            env["MCCL_SOCKET_IFNAME"] = ifname
        return env

    def rank_specs(self, base_env: Optional[Mapping[str, str]] = None) -> List[RankSpec]:
        specs = []
        shim = shim_argv(self.python)
        for node_rank, host in enumerate(self.hosts):
            if self.joining is not None and host.name != self.joining:
                continue
            for local_rank in range(self.nproc_per_node):
                rank = node_rank * self.nproc_per_node + local_rank
                spec = shim_input(argv=self.command, cwd=self.cwd, label=f"{host.name} r{rank}",
                                  env=self.rank_env(node_rank, local_rank, base_env), grace=self.grace)
                argv = shim
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
            nodes = len(self.hosts)
            where = "on this machine over loopback" + (f" as {nodes} nodes × {self.nproc_per_node}" if nodes > 1
                                                       else "")
        else:
            where = f"on {len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''} × {self.nproc_per_node}"
        return f"{ranks} {where} (master {self.master_addr}:{self.master_port})"


def with_launched_settings(settings: Settings, environ: Optional[Mapping[str, str]] = None) -> Settings:
    """A rank's side: `settings` (an `ElasticSettings`) with what the launcher set: ``min_members`` from
    MCCL_ELASTIC_MIN_MEMBERS (ValueError naming the variable when it is not a positive integer), and
    ``leave_when_owner_logs_in`` from MCCL_ELASTIC_LEAVE_ON_LOGIN=1."""
    environ = os.environ if environ is None else environ
    if environ.get(LEAVE_ON_LOGIN_VAR, "") == "1":
        settings = replace(settings, leave_when_owner_logs_in=True)
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
    return replace(settings, min_members=value)


def launched_as_joiner(environ: Optional[Mapping[str, str]] = None) -> bool:
    """A rank's side: whether `mccl join` started it (MCCL_ELASTIC_JOIN=1)."""
    environ = os.environ if environ is None else environ
    return environ.get(JOIN_VAR, "") == "1"


def local_plan(num: int, command: Sequence[str], *, master_port: Optional[int] = None, **kwargs) -> LaunchPlan:
    """`num` hosts that are this machine (loopback), of ``nproc_per_node`` ranks each (kwargs; default 1); port:
    `master_port` or a free one. (`mccl launch --local N` is local_plan(1, nproc_per_node=N).)"""
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


def fleet_plan(command: Sequence[str], *, local: Optional[int] = None, switch: Optional[str] = None,
               hostfile: Optional[str] = None, nproc_per_node: Optional[int] = None, ssh: str = DEFAULT_SSH,
               python: str = sys.executable, chdir: Optional[str] = None, master_port: Optional[int] = None,
               grace: float = DEFAULT_GRACE_S, env: Optional[Mapping[str, str]] = None) -> LaunchPlan:
    """The plan for one of `local` (N), `switch` (a tag) or `hostfile` (a path), as `mccl launch` and `mccl
    doctor` take them. `nproc_per_node`: ranks per host (None: 1 per host, and ``local=N`` is one node of N
    ranks, as ``torchrun --nproc-per-node N``; with P given, N nodes of P ranks each). `ssh`: the ssh command
    as one string; `chdir`: every rank's working directory (default: this one). Raises LaunchError (or
    HostfileError, also for a host whose addr is neither an IP address nor a name that resolves:
    `hostfile.check_addresses`)."""
    cwd = os.path.abspath(chdir) if chdir else os.getcwd()
    common = dict(nproc_per_node=nproc_per_node or 1, python=python, cwd=cwd, env=dict(env or {}), grace=grace,
                  master_port=master_port)
    if local is not None or switch is not None:
        if not os.path.isdir(cwd):
            raise LaunchError(f"--chdir {chdir}: no such directory")
        if local is not None:
            nodes = 1 if nproc_per_node is None else local
            return local_plan(nodes, command, **{**common, "nproc_per_node": nproc_per_node or local})
        from ..switch import SwitchError, SwitchFleet

        try:
            return switch_plan(SwitchFleet.attach(switch), command, **common)
        except (SwitchError, ValueError) as e:
            raise LaunchError(f"--switch {switch}: {e}") from None
    try:
        ssh_words = shlex.split(ssh)
    except ValueError as e:
        raise LaunchError(f"--ssh {ssh!r}: {e}") from None
    loaded = load_hostfile(hostfile)
    check_addresses(loaded)
    return hostfile_plan(loaded, command, ssh=ssh_words, **common)
