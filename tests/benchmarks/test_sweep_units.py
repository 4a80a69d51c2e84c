"""The benchmark harness's own pieces, in one process: series and sizes parsing, the correctness check of
every collective against float64, the report files."""
from __future__ import annotations

import csv

import pytest
import torch

from sweep import report
from sweep.ops import OPS, Buffers, element_count
from sweep.series import launch_groups, parse_series
from sweep.sizes import parse_size, size_sweep


def test_series_parsing_and_launch_groups():
    s = parse_series("mccl,mccl:MCCL_ALGO=ring:rtol=1e-3,gloo", {"OMP_NUM_THREADS": "1"})
    assert [x.label for x in s] == ["mccl", "mccl[MCCL_ALGO=ring]", "gloo"]
    assert s[1].env_dict == {"MCCL_ALGO": "ring", "OMP_NUM_THREADS": "1"} and s[1].rtol == 1e-3
    # a launch's group reads MCCL_* when it is made: a series with its own MCCL_* variables needs its own launch;
    # Gloo ignores them and shares the launch of plain mccl
    assert [[x.label for x in g] for g in launch_groups(s)] == [["mccl", "gloo"], ["mccl[MCCL_ALGO=ring]"]]
    assert parse_series("gloo,mccl:MCCL_X=1:label=x")[1].label == "x"


@pytest.mark.parametrize("text, message", [
    ("nccl", "unknown backend 'nccl'"),
    ("mccl:ALGO", "'ALGO' is not KEY=VALUE"),
    ("mccl:algo=ring", "neither an environment variable"),
    ("mccl,mccl", "appear twice"),
    ("mccl:rtol=x", "is not a number"),
])
def test_series_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_series(text)


def test_sizes():
    assert parse_size("4K") == 4096 and parse_size("256M") == 256 << 20 and parse_size("100") == 100
    assert size_sweep(4096, 256 << 20, 2)[-1] == 256 << 20 and len(size_sweep(4096, 256 << 20, 2)) == 17
    assert size_sweep(4 << 10, 1 << 20, 4) == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
    with pytest.raises(ValueError, match="4X"):
        parse_size("4X")
    with pytest.raises(ValueError, match="at least 2"):
        size_sweep(1, 2, 1)


def _fake_result(b: Buffers) -> None:
    """What a correct collective leaves in b.out, computed independently of Buffers.expected: every rank's
    full input vector v_q, then the op's definition."""
    n, r, c = b.world, b.rank, b.shard
    full = [(b.x.double() * (1 + q) + q / 4).to(b.dtype).double() for q in range(n)]
    if b.op in ("allreduce", "allreduce_int8"):  # int8: what an exact one would give
        want = sum(full)
    elif b.op == "broadcast":
        want = full[0]
    elif b.op == "reduce":  # checked on the root (rank 0) only
        want = sum(full) if r == 0 else b.out.double()
    elif b.op == "allgather":
        want = torch.cat([full[q][q * c:(q + 1) * c] for q in range(n)])
    elif b.op == "reduce_scatter":
        want = sum(full)[r * c:(r + 1) * c]
    else:  # alltoall
        want = torch.cat([full[q][r * c:(r + 1) * c] for q in range(n)])
    b.out.copy_(want)


@pytest.mark.parametrize("op", list(OPS))
def test_check_accepts_right_and_rejects_wrong_results(op):
    world, rank = 3, 0 if op == "reduce" else 1
    count = element_count(op, 3000 * 4 + 4, world, 4)
    assert count % world == 0 or not OPS[op].sharded
    b = Buffers(op, count, rank, world, torch.float32)
    _fake_result(b)
    assert b.check() <= b.default_rtol()
    b.out[len(b.out) // 2] += 0.01 * b.out.abs().max()
    assert b.check() == pytest.approx(0.01, rel=0.05)


def test_report_files(tmp_path):
    rows = [{"size_bytes": 4096, "series": "mccl", "x": 1.5}, {"size_bytes": 8192, "series": "gloo", "y": "a"}]
    report.write_csv(tmp_path / "r.csv", rows)
    with open(tmp_path / "r.csv", newline="") as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == ["size_bytes", "series", "x", "y"] and back[1]["y"] == "a"
    md = report.markdown("T", {"command": "x --y", "where": "here"}, (["a", "b"], [["1", "2"]]), ["note"])
    assert "- command: `x --y`" in md and "| a | b |\n|---|---|\n| 1 | 2 |" in md and md.endswith("note\n")
    assert report.human_size(4096) == "4 KiB" and report.human_size(256 << 20) == "256 MiB"


def _entry(seq, issued, started, ready, done, wire_bytes=100):
    return {"seq": seq, "issued_ns": issued, "started_ns": started, "ready_ns": ready, "done_ns": done,
            "bytes": 2 * wire_bytes, "wire_bytes": wire_bytes}


def test_timeline_breakdown_parts_add_up_to_the_step():
    from sweep import ddp_timeline

    # seq 0: before the step [100, 450]; 1: held 10 after its issue, staged 5, waits 15 for a peer, then 60;
    # 2: issued 50 after 1 was done (starved), held 10, 40; 3: issued while 2 ran, starts as 2 ends, staged 10, 90
    entries = [_entry(0, 50, 60, 60, 70), _entry(1, 110, 120, 125, 200), _entry(2, 250, 260, 260, 300),
               _entry(3, 280, 300, 310, 400)]
    latest = [0, 140, 250, 310]  # seq 2: every peer was ready before this rank
    p = ddp_timeline.breakdown(entries, 100, 450, 4, latest)
    assert p["collectives"] == 3
    assert p["before_first"] == pytest.approx(10e-9) and p["after_last"] == pytest.approx(50e-9)
    assert p["held"] == pytest.approx((10 + 10 + 0) * 1e-9)
    assert p["staging"] == pytest.approx((5 + 0 + 10) * 1e-9)
    assert p["peers"] == pytest.approx(15e-9) and p["engine"] == pytest.approx((60 + 40 + 90) * 1e-9)
    assert p["starved"] == pytest.approx(50e-9)
    assert p["ring_bytes"] == pytest.approx(3 * 1.5 * 100)  # 2(n-1)/n of the payloads on the wire
    parts = sum(p[k] for k in ddp_timeline.PARTS if k not in ("collectives", "ring_bytes"))
    assert parts == pytest.approx(350e-9)


def test_timeline_latest_ready_is_the_max_over_ranks_and_a_lost_collective_fails():
    from sweep import ddp_timeline

    others = torch.tensor([0, 500, 0])  # what the other rank holds, as the reductions would combine it

    def max_reduce(t):
        if t.numel() == len(others):
            t.copy_(torch.maximum(t, others))

    entries = [_entry(0, 1, 2, 3, 4), _entry(1, 10, 20, 30, 40), _entry(2, 50, 60, 70, 80)]
    assert ddp_timeline.latest_ready(entries, max_reduce, lambda t: None) == [3, 500, 70]
    with pytest.raises(ddp_timeline.TimelineIncomplete, match="MCCL_TIMELINE_ENTRIES is smaller"):
        ddp_timeline.latest_ready(entries[1:], max_reduce, lambda t: None)  # seq 0 was overwritten


def test_tcp_counters_parse_proc_net_pairs(tmp_path, monkeypatch):
    from sweep import tcp_counters

    snmp = tmp_path / "snmp"
    snmp.write_text("Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RetransSegs InErrs\nTcp: 1 17 0\n")
    netstat = tmp_path / "netstat"
    netstat.write_text("TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes TCPToZeroWindowAdv\nTcpExt: 0 3 9 4\n")
    monkeypatch.setattr(tcp_counters, "_SOURCES", ((str(snmp), "Tcp", "RetransSegs"),
                                                   (str(netstat), "TcpExt", "TCPTimeouts"),
                                                   (str(netstat), "TcpExt", "TCPLossProbes"),
                                                   (str(netstat), "TcpExt", "TCPToZeroWindowAdv")))
    assert tcp_counters.read() == (17, 3, 9, 4)
    netstat.unlink()  # a system without the file (macOS): zeros, not an error
    assert tcp_counters.read() == (17, 0, 0, 0)
