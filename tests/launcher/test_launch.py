"""`mccl launch`: argument errors, the argv of the ssh path, and real runs of the installed `mccl` script
(--local, and the ssh path against a fake `ssh` that runs the remote command here)."""
from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import (MCCL, RANK_PROGRAMS, alive, assert_all_gone, env_with_fake_ssh, fake_ssh_calls, require_script,
                        run_mccl, wait_for_files)
from lightning_mccl.cli import main
from lightning_mccl.launcher import (SHIM_BOOTSTRAP, RankProcess, RankSpec, fleet_plan, hostfile_plan, local_plan,
                                     rank_shim, resolve_command, secret_names_with_values)
from lightning_mccl.hostfile import parse_hostfile


def write_hostfile(path: Path, n: int, ifname0=None) -> Path:
    lines = ["hosts:"]
    for i in range(n):
        lines += [f"  - name: mac-{i}", f"    addr: 127.0.0.{i + 1}"]
        if i == 0 and ifname0:
            lines.append(f"    ifname: {ifname0}")
    path.write_text("\n".join(lines) + "\n")
    return path


def prefixed(stdout: str) -> dict:
    """{label: [lines]} of the launcher's stdout; fails on a line without a rank prefix."""
    out = {}
    for line in stdout.splitlines():
        assert line.startswith("["), f"unprefixed output line: {line!r}"
        label, _, text = line[1:].partition("]")
        out.setdefault(label, []).append(text.strip())
    return out


def pids_of(out_dir: Path, ranks) -> list:
    pids = []
    for r in ranks:
        info = json.loads((out_dir / f"pids-{r}.json").read_text())
        pids += [info["rank"], info["child"]]
    return pids


# -- bad input: exit code 2 and a message naming the cause (in process: fast) ------------------------------------


@pytest.mark.parametrize("args, message", [
    (["launch", "--", "python", "x.py"], "one of the arguments --hostfile --local --switch is required"),
    (["launch", "--local", "2", "--hostfile", "f.yaml", "--", "python", "x.py"],
     "argument --hostfile: not allowed with argument --local"),
    (["launch", "--local", "2"], "missing the command to run"),
    (["launch", "--local", "2", "--"], "missing the command to run"),
    (["launch", "--local", "0", "--", "true"], "argument --local: must be at least 1, got 0"),
    (["launch", "--local", "2", "--master-port", "70000", "--", "true"], "70000 is not a TCP port"),
    (["launch", "--local", "2", "--env", "1X=y", "--", "true"], "'1X' is not a variable name"),
    (["launch", "--local", "2", "--chdir", "/no/such/dir", "--", "true"], "--chdir /no/such/dir: no such directory"),
    (["launch", "--hostfile", "/no/such/fleet.yaml", "--", "true"], "cannot read hostfile /no/such/fleet.yaml"),
    (["doctor", "--local", "2", "--", "python", "x.py"], "mccl doctor takes no command"),
    (["doctor", "--local", "2", "--timeout", "0"], "argument --timeout: must be more than 0 seconds, got 0"),
    (["doctor", "--local", "2", "--timeout", "-1"], "argument --timeout: must be more than 0 seconds, got -1"),
    (["doctor", "--local", "2", "--timeout", "soon"], "argument --timeout: 'soon' is not a number of seconds"),
    (["launch", "--local", "2", "--grace", "-1", "--", "true"], "argument --grace: must not be negative, got -1.0"),
])
def test_argument_errors_exit_2_with_a_message(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "usage: mccl" in err


def test_bad_hostfile_exits_2_naming_the_problem(tmp_path, capsys):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("hosts:\n  - {name: a, addr: 10.0.0.1}\n  - {name: b, addr: 10.0.0.1}\n")
    assert main(["launch", "--hostfile", str(bad), "--", "python", "train.py"]) == 2
    assert f"{bad}: hosts[0] and hosts[1] have the same addr '10.0.0.1'" in capsys.readouterr().err
    bad.write_text("hosts:\n  - {name: -oProxyCommand=evil, addr: 10.0.0.1}\n")
    assert main(["launch", "--hostfile", str(bad), "--", "python", "train.py"]) == 2
    assert "starts with '-'" in capsys.readouterr().err


@pytest.mark.parametrize("subcommand", ["launch", "doctor"])
def test_a_bad_address_is_refused_at_once_naming_its_line(tmp_path, capsys, subcommand):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("hosts:\n  - {name: mac-0, addr: 127.0.0.1}\n  - {name: mac-1, addr: 10.0.0.311}\n"
                   "  - {name: mac-2, addr: not an ip}\n  - {name: mac-3, addr: nosuch.invalid}\n")
    start = time.monotonic()
    # --ssh false: were any rank started, it would fail at once with exit code 1 (not 2)
    command = ["--", "true"] if subcommand == "launch" else []
    code = main([subcommand, "--hostfile", str(bad), "--ssh", "false", *command])
    assert code == 2 and time.monotonic() - start < 5.0
    err = " ".join(capsys.readouterr().err.split())  # argparse wraps nothing, rich may
    assert f"{bad}:3: hosts[1] (mac-1): addr '10.0.0.311' is not an IPv4 address (Octet 311 (> 255)" in err, err
    assert f"{bad}:4: hosts[2] (mac-2): addr 'not an ip' is neither an IP address nor a host name" in err, err
    assert f"{bad}:5: hosts[3] (mac-3): addr 'nosuch.invalid' does not resolve here" in err, err
    assert "mac-0" not in err


def test_env_help_says_how_to_keep_a_value_off_the_command_line(capsys):
    assert main(["launch", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("NAME alone takes the value from the launcher's environment and keeps it off the command line, where "
            "`ps` shows NAME=VALUE to every user of this machine") in help_text, help_text


def test_secret_looking_names_given_with_a_value():
    items = ["MY_API_KEY=1", "github_token=x", "DB_Password=y", "HF_HOME=/x", "MCCL_AUTH_SECRET", "SSH_PASS=",
             "MCCL_DEBUG=INFO"]
    assert secret_names_with_values(items) == ["MY_API_KEY", "github_token", "DB_Password", "SSH_PASS"]


def test_a_secret_value_on_the_command_line_gets_a_warning_naming_only_the_variable(tmp_path):
    token = secrets.token_hex(16)
    env = {**os.environ, "DB_PASSWORD": "from-the-environment"}
    r = run_mccl("launch", "--local", "1", "--env", f"MY_API_TOKEN={token}", "--env", "HF_HOME=/data/hf",
                 "--env", "DB_PASSWORD", "--", "python", RANK_PROGRAMS, "env", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"mccl: warning: --env MY_API_TOKEN=... puts the value of MY_API_TOKEN on this command line, where `ps` "
            f"shows it to every user of this machine; export MY_API_TOKEN and give --env MY_API_TOKEN instead"
            in r.stderr), r.stderr
    assert token not in r.stdout + r.stderr
    assert "HF_HOME" not in r.stderr and "DB_PASSWORD" not in r.stderr, r.stderr  # no value given, or no secret


# -- the argv of each rank (pure) -----------------------------------------------------------------------------


def test_ssh_argv_for_a_two_host_hostfile():
    hostfile = parse_hostfile({"master_port": 29555, "hosts": [
        {"name": "studio-01", "addr": "10.0.0.11", "ifname": "en8"},
        {"name": "studio-02", "addr": "10.0.0.12"}]}, "fleet.yaml")
    python = "/Users/me/my venv/bin/python"
    command, replaced = resolve_command(["python", "train.py", "fit", "--config", "vit 1.yaml"], python)
    assert replaced and command[0] == python
    plan = hostfile_plan(hostfile, command, ssh=["ssh", "-o", "BatchMode=yes"], python=python,
                         cwd="/Users/me/proj", env={"HF_HOME": "/data/hf"})
    launcher_env = {"MCCL_DEBUG": "INFO", "MCCL_SOCKET_IFNAME": "en0", "MCCL_NODE_RANK": "7", "HOME": "/home/x",
                    "MCCL_RESTART_COUNT": "5"}  # a launcher started by a restarted job: never copied
    specs = plan.rank_specs(base_env=launcher_env)
    assert [(s.rank, s.host, s.label) for s in specs] == [(0, "studio-01", "studio-01 r0"),
                                                           (1, "studio-02", "studio-02 r1")]
    for node, spec in enumerate(specs):
        argv = list(spec.argv)
        assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-T", spec.host] and len(argv) == 6
        remote = shlex.split(argv[5])  # what the remote login shell will see
        assert remote[:4] == ["exec", python, "-c", SHIM_BOOTSTRAP] and len(remote) == 5
        assert base64.b64decode(remote[4]) == Path(rank_shim.__file__).read_bytes()
        assert spec.stdin.endswith(b"\n") and spec.stdin.count(b"\n") == 1  # the spec: stdin's first line
        shim = rank_shim.decode_spec(spec.stdin.decode().strip())
        assert shim["argv"] == [python, "train.py", "fit", "--config", "vit 1.yaml"]
        assert shim["cwd"] == "/Users/me/proj" and shim["label"] == spec.label
        expected = {"MASTER_ADDR": "10.0.0.11", "MASTER_PORT": "29555", "WORLD_SIZE": "2", "RANK": str(node),
                    "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(node), "GROUP_RANK": str(node),
                    "MCCL_NODE_RANK": str(node), "MCCL_DEBUG": "INFO", "HF_HOME": "/data/hf",
                    "PYTHONUNBUFFERED": "1", "MCCL_RESTART_COUNT": "0", "MCCL_MAX_RESTARTS": "0",
                    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                    "TORCHELASTIC_RUN_ID": plan.run_id, "MCCL_HOSTS": "studio-01,studio-02", "MCCL_CAFFEINATE": "auto"}
        if node == 0:
            expected["MCCL_SOCKET_IFNAME"] = "en8"  # the host's ifname, never the launcher's en0
        assert shim["env"] == expected
    # --local runs the very same shim argv, without the ssh in front
    local = local_plan(2, command, python=python, cwd="/Users/me/proj").rank_specs(base_env={})
    assert [s.host for s in local] == ["local", "local"]
    assert list(local[0].argv) == [python, "-c", SHIM_BOOTSTRAP, remote[4]]
    assert rank_shim.decode_spec(local[1].stdin.decode())["env"]["MASTER_ADDR"] == "127.0.0.1"


def test_nproc_per_node_numbers_ranks_host_by_host():
    hostfile = parse_hostfile(["10.0.0.1", "10.0.0.2"])
    plan = hostfile_plan(hostfile, ["train"], nproc_per_node=2, master_port=4000)
    envs = [rank_shim.decode_spec(s.stdin.decode())["env"] for s in plan.rank_specs(base_env={})]
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "2", "4"), ("1", "0", "1", "2", "4"), ("2", "1", "0", "2", "4"), ("3", "1", "1", "2", "4")]
    assert all(e["MASTER_PORT"] == "4000" and e["OMP_NUM_THREADS"] == "1" for e in envs)  # as torchrun


@pytest.mark.parametrize("where, expected", [
    (["--local", "2"], [("0", "0", "0", "2"), ("1", "0", "1", "2")]),  # one node, as torchrun --nproc-per-node 2
    (["--local", "2", "--nproc-per-node", "1"], [("0", "0", "0", "1"), ("1", "1", "0", "1")]),  # 2 nodes of 1
    (["--local", "2", "--nproc-per-node", "2"], [("0", "0", "0", "2"), ("1", "0", "1", "2"), ("2", "1", "0", "2"),
                                                 ("3", "1", "1", "2")]),
])
def test_local_n_is_one_node_of_n_ranks_unless_nproc_per_node_is_given(where, expected):
    options = {name: int(value) for name, value in zip(where[::2], where[1::2])}
    plan = fleet_plan(["train"], local=options["--local"], nproc_per_node=options.get("--nproc-per-node"))
    envs = [rank_shim.decode_spec(s.stdin.decode())["env"] for s in plan.rank_specs(base_env={})]
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == expected
    assert {e["WORLD_SIZE"] for e in envs} == {str(len(expected))}


def test_output_is_split_into_lines_at_newlines_and_carriage_returns():
    r = RankProcess(RankSpec(0, "h", ()))
    assert r.split(b"one\ntwo\r\nthr") == ["one", "two"]
    assert r.split(b"ee\n\n\rprogress 1\rprogress 2\r") == ["three", "", "progress 1", "progress 2"]
    assert r.split(b"no newline", final=True) == ["no newline"]


# -- real runs of the `mccl` script ----------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["local", "ssh"])
def test_a_failing_rank_stops_the_others_and_sets_the_exit_code(tmp_path, via):
    if via == "local":
        where, env = ["--local", "3"], None
    else:
        where, env = ["--hostfile", write_hostfile(tmp_path / "fleet.yaml", 3)], env_with_fake_ssh()
    # --grace 30: the sleeping ranks must go at the first TERM, not when the launcher loses patience
    r = run_mccl("launch", *where, "--grace", "30", "--", "python", RANK_PROGRAMS, "fail", tmp_path, 1, 3, env=env)
    ended = time.time()
    assert r.returncode == 3, r.stderr
    failed = json.loads((tmp_path / "failed.json").read_text())
    assert ended - failed["time"] < 8.0, f"launcher took {ended - failed['time']:.1f} s to stop after the failure"
    assert_all_gone(pids_of(tmp_path, [0, 2]) + [failed["pid"]])
    host = "local" if via == "local" else "mac-1"
    assert f"rank 1 on {host} exited with code 3; stopping the other 2 ranks" in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(  # no error line in its output: its last line
        f"failed: rank 1 on {host} exited with code 3; its last line: rank 1 failing with exit code 3"), r.stderr
    out = prefixed(r.stdout)
    assert out[f"{host} r1"][0] == "rank 1 failing with exit code 3"
    assert "rank 0 sleeping" in out[f"{'local' if via == 'local' else 'mac-0'} r0"]


def test_a_two_rank_mccl_allreduce_runs_and_every_line_is_prefixed(tmp_path):
    r = run_mccl("launch", "--local", "2", "--", "python", RANK_PROGRAMS, "allreduce", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = prefixed(r.stdout)  # every line carries its rank's prefix
    for rank in (0, 1):
        # --local 2 is one node of 2 ranks, as torchrun --nproc-per-node 2
        line = f"allreduce rank={rank} world=2 env_rank={rank} local_rank={rank} node_rank=0 sum=[3.0, 3.0, 3.0, 3.0]"
        assert line in out[f"local r{rank}"], r.stdout
    assert "all 2 ranks finished" in r.stderr


def test_ssh_path_end_to_end_with_a_fake_ssh(tmp_path):
    log = tmp_path / "ssh.log"
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    hostfile = write_hostfile(tmp_path / "fleet.yaml", 2, ifname0="lo")
    env = env_with_fake_ssh(log, MCCL_TEST_FORWARDED="no: --env wins")
    # the fake ssh passes ours on
    for name in ("MCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "MCCL_NODE_RANK", "PYTHONUNBUFFERED"):
        env.pop(name, None)
    r = run_mccl("launch", "--hostfile", hostfile, "--master-port", "29577", "--chdir", workdir,
                 "--ssh", "ssh -o BatchMode=yes -p 22", "--env", "MCCL_TEST_FORWARDED=yes",
                 "--", "python", RANK_PROGRAMS, "env", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = fake_ssh_calls(log)
    assert sorted(host for host, _ in calls) == ["mac-0", "mac-1"]
    assert all(remote.startswith(f"exec {sys.executable} -c ") for _, remote in calls)
    out = prefixed(r.stdout)
    for rank in (0, 1):
        (line,) = out[f"mac-{rank} r{rank}"]
        got = json.loads(line)
        assert got["cwd"] == str(workdir) and got["python"] == sys.executable
        assert got["env"] == {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29577", "WORLD_SIZE": "2", "RANK": str(rank),
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(rank), "GROUP_RANK": str(rank),
            "MCCL_NODE_RANK": str(rank), "MCCL_SOCKET_IFNAME": "lo" if rank == 0 else None,
            # the rank shim's choice for Lightning's Gloo group: rank 0 the host's ifname, rank 1 the
            # interface that routes to MASTER_ADDR (127.0.0.1 here)
            "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1", "MCCL_TEST_FORWARDED": "yes"}


def _start_sleepers(tmp_path, launcher_args=(), ignore_int=False):
    """`mccl launch --local 2` of two sleeping ranks (each with a grandchild); returns it once all 4 pids are known."""
    require_script()
    proc = subprocess.Popen([MCCL, "launch", "--local", "2", *launcher_args, "--", "python", RANK_PROGRAMS, "sleep",
                             str(tmp_path), *(["--ignore-int"] if ignore_int else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_files([tmp_path / "pids-0.json", tmp_path / "pids-1.json"])
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc, pids_of(tmp_path, [0, 1])


def _finish(proc, timeout=30):
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the launcher did not exit within {timeout} s\n{out}\n{err}")


def test_sigint_stops_every_rank_and_exits_130(tmp_path):
    proc, pids = _start_sleepers(tmp_path)
    assert all(alive(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    out, err = _finish(proc)
    assert proc.returncode == 130, err
    assert_all_gone(pids)
    assert "received SIGINT: stopping all ranks" in err
    lines = prefixed(out)
    for label in ("local r0", "local r1"):  # one line each (quiet_stop); 130: the rank died of the SIGINT
        assert lines[label][-1].startswith("stopped by the launcher (exit code 130)"), out


def test_ranks_ignoring_sigint_are_killed_after_the_grace(tmp_path):
    proc, pids = _start_sleepers(tmp_path, ["--grace", "1"], ignore_int=True)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = _finish(proc)
    assert proc.returncode == 130, err
    assert 1.0 <= time.monotonic() - start < 10.0
    assert_all_gone(pids)
    assert "still running 1 s after being asked to stop: killing them" in err


def test_ranks_do_not_outlive_a_killed_launcher(tmp_path):
    proc, pids = _start_sleepers(tmp_path)
    proc.kill()  # SIGKILL: no chance to clean up; the rank shims see their stdin close
    _finish(proc)
    assert_all_gone(pids, within=10.0)
