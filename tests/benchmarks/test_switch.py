"""The switch emulator (lightning_mccl.switch): names, rates, and, where this process may create network
namespaces (root: CAP_NET_ADMIN and CAP_SYS_ADMIN, `ip` and `tc` present; CI runs as root), a real 2-host switch: shaping,
mccl collectives inside it, and a clean `down`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench_runner import explain, run_script
from lightning_mccl.switch import SwitchError, SwitchFleet, measure_goodput, privilege_problem, random_tag, rates
from lightning_mccl.cli import main as cli_main
from lightning_mccl.switch import netns

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

PROBLEM = privilege_problem()
needs_netns = pytest.mark.skipif(PROBLEM is not None, reason=f"switch emulator unavailable: {PROBLEM}")


def test_rates_and_bursts():
    assert rates.parse_rate("1gbit") == 10**9 and rates.parse_rate("100mbit") == 10**8
    assert rates.parse_rate("2.5g") == 25 * 10**8
    assert rates.default_burst(10**9) == 80_000 and abs(rates.default_burst(10**10) - 256_000) < 5_000
    assert abs(rates.line_rate_goodput(10**9) / 1e9 - 0.956) < 0.001
    assert rates.parse_size("80kb") == 80 * 1024
    for bad, message in (("fast", "write it as tc does"), ("10kbit", "below 1 mbit")):
        with pytest.raises(ValueError, match=message):
            rates.parse_rate(bad)


def test_names_fit_linux_limits_and_are_prefixed():
    f = SwitchFleet(254, "10gbit", tag="abcdefg")
    names = [f.bridge] + [f.veth(i) for i in (0, 253)]
    assert all(len(n) <= 15 for n in names) and all(n.startswith("mc-abcdefg-") for n in names)
    assert f.netns(253) == "mccl-abcdefg-h253"
    assert f.exec_argv(1, ["true"])[1:] == ["netns", "exec", "mccl-abcdefg-h1", "true"]
    with pytest.raises(ValueError, match="1-7 lowercase"):
        SwitchFleet(2, tag="Bad_Tag")
    with pytest.raises(ValueError, match="1 to 254"):
        SwitchFleet(255)
    with pytest.raises(ValueError, match="hosts 0..1"):
        SwitchFleet(2, tag="abc").netns(2)
    with pytest.raises(SwitchError, match="not up"):
        SwitchFleet(2, tag="abc").host_ip(0)


def test_launch_names_a_missing_switch(capsys):
    code, out, err = _mccl(capsys, "launch", "--switch", "nosuch", "--", "true")
    assert code == 2 and "no switch 'nosuch' is up" in err, err


def _ours(tag):
    return ([n for n in netns.netns_list() if n.startswith(f"mccl-{tag}-")]
            + [n for n in netns.link_names() if n.startswith(f"mc-{tag}-")])


@pytest.fixture
def fleet():
    f = SwitchFleet(2, "1gbit", tag=random_tag())  # recorded in /run/mccl-switch, where --switch TAG looks
    f.up()
    try:
        yield f
    finally:
        f.down()


@needs_netns
def test_switch_shapes_both_directions(fleet):
    assert sorted(_ours(fleet.tag)) == sorted([fleet.netns(0), fleet.netns(1), fleet.bridge, fleet.veth(0),
                                               fleet.veth(1)])
    assert fleet.health() == []
    # a functional check of the shaping with broad bounds (this may share 2 busy cores): well under the
    # unshaped veth speed (tens of Gbit/s), and not absurdly low
    for a, b in ((0, 1), (1, 0)):
        r = measure_goodput(fleet, a, b, seconds=2.0, tool="python")
        assert 0.5 < r.fraction_of_rate < 1.1, r
    q = fleet.qdiscs(1)
    assert q["to_host"]["bytes"] > 10**8 and q["from_host"]["bytes"] > 10**8, q
    same = SwitchFleet.attach(fleet.tag, state_dir=fleet.state_dir)
    assert same.host_ip(1) == fleet.host_ip(1) and same.rate_bps == 10**9 and same.congestion == "cubic"
    with pytest.raises(SwitchError, match="already up"):
        SwitchFleet(2, tag=fleet.tag, state_dir=fleet.state_dir).up()


def _host_congestion(fleet, i: int) -> str:
    argv = fleet.exec_argv(i, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def _machine_sysctl(name: str) -> str:
    with open(f"/proc/sys/net/ipv4/{name}") as f:
        return f.read().strip()


@needs_netns
def test_hosts_run_cubic_whatever_the_machine_default(fleet):
    # the emulated hosts' TCP is a Mac's (cubic), not the machine's default (BBR on the GPU host, and here)
    if "cubic" not in _machine_sysctl("tcp_available_congestion_control").split():
        pytest.skip("this kernel has no cubic")
    assert _host_congestion(fleet, 0) == _host_congestion(fleet, 1) == "cubic"
    assert "TCP cubic" in fleet.describe()
    with SwitchFleet(1, "1gbit", tag=random_tag(), congestion="system") as own:
        assert _host_congestion(own, 0) == _machine_sysctl("tcp_congestion_control")
        assert "TCP" not in own.describe()


@needs_netns
def test_an_unknown_congestion_control_names_what_the_kernel_has(tmp_path):
    f = SwitchFleet(1, "1gbit", tag=random_tag(), congestion="nosuchcc", state_dir=str(tmp_path))
    with pytest.raises(SwitchError, match=r"cannot set TCP congestion control 'nosuchcc'.*this kernel has .*reno"):
        f.up()
    assert _ours(f.tag) == []  # what it had built is gone


def test_congestion_names_are_checked():
    with pytest.raises(ValueError, match="a Linux TCP congestion control name"):
        SwitchFleet(2, congestion="cubic; reboot")


@needs_netns
def test_launch_runs_each_rank_inside_its_host(fleet, capsys):
    code, out, err = _mccl(capsys, "launch", "--switch", fleet.tag, "--", "sh", "-c",
                           "echo env $RANK $MASTER_ADDR $MCCL_SOCKET_IFNAME; ip -br -4 addr show dev mccl0")
    assert code == 0, err
    for i in (0, 1):
        assert f"[h{i} r{i}] env {i} {fleet.host_ip(0)} mccl0" in out, out
        assert f"{fleet.host_ip(i)}/24" in out.split(f"[h{i} r{i}] mccl0", 1)[1].splitlines()[0], out


@needs_netns
def test_collectives_inside_a_throwaway_switch(tmp_path):
    out = tmp_path / "out"
    proc = run_script("allreduce.py", "--hosts", 2, "--rate", "1gbit", "--op", "allreduce",
                      "--sizes", "4K,1M", "--iters", 2, "--min-iters", 2, "--warmup", 1, "--time-budget", 0.05,
                      "--out", out, "--timeout", 100, timeout=150)
    assert proc.returncode == 0, explain(proc)
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 and all(",yes," in r for r in rows[1:]), rows
    md = (out / "results.md").read_text()
    assert "2 ranks on an emulated switch 't" in md and "2 hosts at 1gbit" in md
    assert "[h1 r1]" in proc.stderr_text  # rank 1 ran on emulated host 1
    tag = md.split("emulated switch '", 1)[1].split("'", 1)[0]
    assert _ours(tag) == []  # the script took its switch down


def _mccl(capsys, *args):
    """`mccl ARGS` in this process (no interpreter start-up); (exit code, stdout, stderr)."""
    code = cli_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@needs_netns
def test_cli_up_status_exec_down(capsys):
    tag = random_tag()
    try:
        code, out, err = _mccl(capsys, "switch", "up", "--hosts", 2, "--rate", "100mbit", "--tag", tag)
        assert code == 0 and f"mccl-{tag}-h1" in out, err
        code, out, err = _mccl(capsys, "switch", "status")
        assert code == 0 and tag in out and "100mbit" in out, err
        ip = SwitchFleet.attach(tag).host_ip(1)
        ex = subprocess.run([sys.executable, "-m", "lightning_mccl.cli", "switch", "exec", "1", "--tag", tag, "--",
                             "ip", "-br", "addr", "show", "dev", "mccl0"], capture_output=True, text=True, timeout=60)
        assert ex.returncode == 0 and ip + "/24" in ex.stdout, ex
    finally:
        code, out, err = _mccl(capsys, "switch", "down", "--tag", tag)
    assert code == 0 and "removed 5" in err, err
    assert _ours(tag) == []
    code, out, err = _mccl(capsys, "switch", "down", "--tag", tag)
    assert code == 0 and "was up" in err


@needs_netns
def test_down_removes_everything_and_is_idempotent(tmp_path):
    f = SwitchFleet(2, "10gbit", tag=random_tag(), state_dir=str(tmp_path))
    with f:
        assert len(_ours(f.tag)) == 5
        assert (tmp_path / f"{f.tag}.json").exists()
    assert _ours(f.tag) == [] and not (tmp_path / f"{f.tag}.json").exists()
    assert f.down() == []
