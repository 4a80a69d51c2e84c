"""`mccl doctor`'s checks of its measurement (fleet_checks): a connection that fails between two hosts named with
its likely cause (macOS's Local Network privacy, a peer's firewall) and the fix, and a Mac below 0.8 of the
fleet's median speed named with what its probe shows; then the connection test itself (doctor_reach) on
this machine: a refused peer is reported by every rank, a master that stays unreachable ends the wait at once.
The macOS probes are canned (test_mac_checks.py); EHOSTUNREACH cannot be had from Local Network privacy here."""
from __future__ import annotations

import errno
import socket
import threading

from lightning_mccl.launcher import doctor_reach
from lightning_mccl.launcher.fleet_checks import check_connections, check_speed
from lightning_mccl.launcher.host_checks import FAIL, OK, WARN
from test_host_checks import PY, mac_probe
from test_mac_checks import BATTERY, IOREG, PMSET, PMSET_LAPTOP, THERM_HOT, good_mac

HOSTS = ["studio-01", "studio-02", "studio-03"]


def _fail(source, target, kind, error):
    return {"from": source, "to": target, "addr": f"10.0.0.1{target + 1}:5123{target}", "kind": kind, "error": error}


def test_no_route_to_host_from_a_mac_names_local_network_privacy():
    setups = [mac_probe(good_mac()) for _ in HOSTS]
    found = check_connections(HOSTS, setups, [_fail(1, 0, "EHOSTUNREACH", "No route to host"),
                                              _fail(1, 2, "EHOSTUNREACH", "No route to host")])
    (f,) = found
    assert (f.host, f.check, f.state) == ("studio-02", "connections", FAIL)
    assert f.detail == (f"cannot connect to 2 of 2 peers (studio-01 (10.0.0.11:51230), studio-03 (10.0.0.13:51232)): No "
                        f"route to host; macOS's Local Network privacy on studio-02 most likely denies its Python ({PY}) "
                        f"the local network (the router and the internet still answer)")
    assert f.fix == ("on studio-02: System Settings > Privacy & Security > Local Network: turn on the Python the ranks "
                     "run (or the app they are started from), then run mccl doctor again")


def test_a_refused_or_dropped_connection_to_a_mac_names_its_firewall():
    setups = [mac_probe(good_mac()) for _ in HOSTS]
    refused, dropped = check_connections(HOSTS, setups, [_fail(0, 2, "ECONNREFUSED", "Connection refused"),
                                                         _fail(1, 2, "timeout", "no answer within 5 s")])
    assert refused.host == "studio-01" and "studio-03's application firewall most likely refuses it" in refused.detail
    fw = "/usr/libexec/ApplicationFirewall/socketfilterfw"
    assert refused.fix == f"sudo {fw} --add {PY} && sudo {fw} --unblockapp {PY}"
    assert "drops it (stealth mode)" in dropped.detail and dropped.fix == refused.fix
    linux = check_connections(["a", "b"], [{"system": "Linux"}, {"system": "Linux"}],
                              [_fail(0, 1, "EHOSTUNREACH", "No route to host")])[0]
    assert "Local Network" not in linux.detail and linux.fix == "check both hosts' addr and ifname in the hostfile"


def _speed(rate, name="Apple M2 Ultra's GPU"):
    return {"device": "mps", "device_name": name, "step_s": 32 / rate, "samples_per_s": rate}


def test_a_slow_mac_is_named_with_the_causes_its_probe_shows():
    hosts = ["studio-01", "studio-02", "studio-03", "studio-04"]
    setups = [mac_probe(good_mac()), mac_probe(good_mac(pmset=[0, PMSET.format(display=10, low=1)],
                                                        therm=[0, THERM_HOT])),
              mac_probe(good_mac(chip=[0, "Apple M1 Max\n"], pmset=[0, PMSET_LAPTOP.format(display=10, mode=0)],
                                 batt=[0, BATTERY], gpu=[0, IOREG.format(u=70)])),
              mac_probe(good_mac())]
    found = check_speed(hosts, setups, [_speed(100.0), _speed(60.0), _speed(50.0, "Apple M1 Max's GPU"), _speed(98.0)])
    assert [f.state for f in found] == [OK, WARN, WARN, OK]
    assert found[0].detail == "100.0 samples/s on Apple M2 Ultra's GPU, 1.27 of the fleet's median (79.0)"
    assert found[1].detail.startswith("60.0 samples/s on Apple M2 Ultra's GPU, 0.76 of the fleet's median (79.0): slow; "
                                      "likely: Low Power Mode; a thermal limit (CPU speed limit 71%)"), found[1].detail
    assert found[1].fix.startswith("sudo pmset -a lowpowermode 0; give it air")
    assert found[2].detail.endswith("likely: Automatic power mode on battery; another program on the GPU (70% busy "
                                    "before the job); an older or smaller chip (Apple M1 Max; most of the fleet: Apple "
                                    "M2 Ultra)"), found[2].detail
    assert found[2].fix == ("connect its power adapter (or System Settings > Battery > Energy Mode: High Power); "
                            "quit it (Activity Monitor: Window > GPU History shows the load); give it a smaller batch "
                            "(lightning_mccl.straggler.propose_batch_sizes)")


def test_a_slow_mac_without_a_visible_cause_and_a_failed_step_are_reported():
    found = check_speed(["a", "b", "c"], [mac_probe(good_mac())] * 3,
                        [_speed(100.0), _speed(40.0), {"error": "ModelError: 'vit_nope' is not a timm model"}])
    assert found[1].state == WARN and "none of the usual causes shows" in found[1].detail
    assert (found[2].state, found[2].detail) == (WARN, "the model step failed: ModelError: 'vit_nope' is not a timm "
                                                       "model")


class DictStore:
    """The store calls doctor_reach makes (set, get, wait), shared by threads standing in for ranks."""

    def __init__(self):
        self.values, self.cond = {}, threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.values[key] = value.encode() if isinstance(value, str) else value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            return self.values[key]

    def wait(self, keys):
        with self.cond:
            assert self.cond.wait_for(lambda: all(k in self.values for k in keys), timeout=30), keys


def test_every_rank_gets_every_failed_connection(monkeypatch):
    """Three ranks on loopback; rank 2 posts the address of a port nobody listens on, as a peer whose firewall
    refuses: ranks 0 and 1 fail to reach it, and all three return the same two failures."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    store, results = DictStore(), {}
    env = {"MASTER_ADDR": "127.0.0.1"}
    real_set = store.set

    def set_(key, value):  # rank 2 advertises the dead port instead of its listener's
        real_set(key, '["127.0.0.1", %d]' % dead_port if key == doctor_reach.KEY + "addr/2" else value)
    monkeypatch.setattr(store, "set", set_)

    def rank(r):
        results[r] = doctor_reach.reach_all(store, r, 3, env, timeout=5.0)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[0] == results[1] == results[2]
    assert [(f["from"], f["to"], f["kind"]) for f in results[0]] == [(0, 2, "ECONNREFUSED"), (1, 2, "ECONNREFUSED")]
    assert results[0][0]["addr"] == f"127.0.0.1:{dead_port}" and results[0][0]["error"] == "Connection refused"


def test_an_unreachable_master_fails_at_once_and_a_refused_one_is_waited_for(monkeypatch):
    env = {"MASTER_ADDR": "10.0.0.11", "MASTER_PORT": "29500"}
    monkeypatch.setattr(doctor_reach, "attempt", lambda a, p, t: ("EHOSTUNREACH", "No route to host"))
    assert doctor_reach.reach_master(2, env, timeout=0.3) == {
        "from": 2, "to": 0, "addr": "10.0.0.11:29500", "kind": "EHOSTUNREACH", "error": "No route to host"}
    monkeypatch.setattr(doctor_reach, "attempt", lambda a, p, t: (errno.errorcode[errno.ECONNREFUSED], "refused"))
    assert doctor_reach.reach_master(2, env, timeout=0.3) is None  # rank 0 not up yet: the rendezvous waits
