"""straggler.py without processes: the warning's patience and threshold, the per-host table, the batch
proposal (sums to the global batch, equalises step time), and the loss scaling that keeps DDP's averaged
gradient equal to the global batch's mean-loss gradient with uneven per-rank batches."""
from __future__ import annotations

import pytest
import torch

from lightning_mccl.straggler import (RankWindow, StragglerReport, format_table, propose_batch_sizes,
                                                scale_loss, summary_text)


def window(computes, hosts=("a", "a", "b")):
    return [RankWindow(r, hosts[r], step_s=max(computes), compute_s=c, wait_s=max(computes) - c,
                       samples_per_s=8 / max(computes)) for r, c in enumerate(computes)]


def test_warning_needs_patience_and_names_host_and_factor():
    report = StragglerReport(threshold=0.2, patience=3, steps_per_window=5)
    assert report.add(window([0.1, 0.1, 0.3])) == []
    assert report.add(window([0.1, 0.1, 0.1])) == []  # the streak is broken
    assert report.add(window([0.1, 0.1, 0.3])) == []
    assert report.add(window([0.1, 0.1, 0.3])) == []
    (message,) = report.add(window([0.1, 0.1, 0.3]))
    assert "host b (rank 2) computes 3.00x as long per step as the median rank" in message
    assert "over the last 15 steps" in message
    assert ("Likely causes on a Mac: Low Power Mode, Automatic power mode on battery, a thermal limit, another program "
            "on the GPU, an older or smaller chip; `mccl doctor --model M --batch B` times each Mac's step and names "
            "which.") in message
    assert report.add(window([0.1, 0.1, 0.3])) == []  # once per rank
    assert StragglerReport(threshold=0.5, patience=1).add(window([0.1, 0.1, 0.14])) == []  # under the threshold


def test_proposal_after_a_warning_keeps_the_fleets_global_batch():
    report = StragglerReport(threshold=0.2, patience=1)
    # 8 samples per rank and step; host b's one rank computes 4x as long as each of host a's two: per compute
    # second a does 2 * 80 samples, b 20, so of the 24 samples b gets 3 and a 21 (~0.13 s vs 0.15 s of compute).
    assert report.add(window([0.1, 0.1, 0.4])) != []
    proposal = report.proposal()
    assert sum(proposal.values()) == 24
    assert proposal == {"a": 21, "b": 3}
    text = summary_text({"metrics": {"time_per_step_s": 0.1, "step_time_s": 0.4, "exposed_fraction": 0.5,
                                     "wire_goodput_gbps": 1.0, "bytes_per_step": 1e6},
                         "hosts": report.host_table(), "slowest": report.slowest_rank(), "world_size": 3,
                         "proposal": proposal})
    assert text.splitlines()[-1].startswith("mccl: batch sizes per host that would equalise step time, same global"
                                            " batch: a: 21, b: 3")
    assert StragglerReport().proposal() is None


def test_host_table_and_slowest_rank():
    report = StragglerReport()
    report.add(window([0.1, 0.2, 0.4]))
    report.add(window([0.1, 0.2, 0.4]))
    rows = report.host_table()
    assert [r["host"] for r in rows] == ["a", "b"] and rows[0]["ranks"] == [0, 1]
    assert rows[0]["compute_s"] == pytest.approx(0.15) and rows[1]["compute_s"] == pytest.approx(0.4)
    assert rows[0]["samples_per_s"] == pytest.approx(2 * 8 / 0.4)
    assert report.slowest_rank() == {"rank": 2, "host": "b", "compute_s": 0.4, "factor": pytest.approx(2.0)}
    text = format_table(rows).splitlines()
    assert text[0].split() == ["host", "ranks", "compute/step", "wait/step", "samples/s"]
    assert text[2].split() == ["b", "2", "400.0", "ms", "0.0", "ms", "20.0"]
    with pytest.raises(ValueError, match="threshold must be > 0"):
        StragglerReport(threshold=0)


def test_batch_proposal_keeps_the_global_batch_and_equalises_step_time():
    rates = {"m1-max": 100.0, "m2-ultra": 250.0, "m2-ultra-b": 250.0}
    sizes = propose_batch_sizes(rates, 192)
    assert sum(sizes.values()) == 192
    assert sizes == {"m1-max": 32, "m2-ultra": 80, "m2-ultra-b": 80}
    times = [sizes[h] / rates[h] for h in rates]
    assert max(times) / min(times) < 1.01
    odd = propose_batch_sizes({"a": 1.0, "b": 1.0, "c": 1.0}, 10)
    assert sum(odd.values()) == 10 and sorted(odd.values()) == [3, 3, 4]
    assert propose_batch_sizes({"slow": 1.0, "fast": 1000.0}, 8, minimum=2) == {"slow": 2, "fast": 6}
    with pytest.raises(ValueError, match="host 'b' has samples/s 0"):
        propose_batch_sizes({"a": 1.0, "b": 0}, 8)
    with pytest.raises(ValueError, match="global batch of 3 cannot give 2 hosts at least 2"):
        propose_batch_sizes({"a": 1.0, "b": 1.0}, 3, minimum=2)


def test_scaled_losses_average_to_the_global_batch_gradient():
    """Two ranks with 3 and 7 samples: the mean of their scaled-loss gradients (what DDP computes) equals the
    gradient of the mean loss over all 10 samples, in float64."""
    torch.manual_seed(0)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(10, 4, dtype=torch.float64)
    y = torch.randn(10, dtype=torch.float64)

    def grad(loss):
        (g,) = torch.autograd.grad(loss, w)
        return g

    reference = grad(((x @ w - y) ** 2).mean())
    shares = [(x[:3], y[:3]), (x[3:], y[3:])]
    per_rank = [grad(scale_loss(((xs @ w - ys) ** 2).mean(), len(xs), 10, 2)) for xs, ys in shares]
    torch.testing.assert_close(sum(per_rank) / 2, reference, rtol=1e-12, atol=1e-12)
    unscaled = [grad(((xs @ w - ys) ** 2).mean()) for xs, ys in shares]
    assert not torch.allclose(sum(unscaled) / 2, reference)
    with pytest.raises(ValueError, match="global_count > 0"):
        scale_loss(torch.tensor(1.0), 1, 0, 2)
