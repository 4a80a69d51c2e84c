"""Engine faults the reliability harnesses found, kept as regression tests: a client that knows the
communicator id is refused (HMAC handshake), a stalled handshake does not block rendezvous (handshakes are
read concurrently, each with a deadline), and a broadcast whose root differs between ranks is a mismatch
(frames left unmatched after a collective are reported). The races (a SIGKILL or SIGSTOP sometimes blamed
on a live rank) are exercised by benchmarks/faults.py; see docs/reliability.md."""
from __future__ import annotations

import json

import pytest

from reliability_env import bounded
from reliability.fault_trials import mismatch_trial
from reliability.garbage_trials import garbage_trial

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)


def test_an_impersonating_client_is_refused():
    rec = bounded(garbage_trial, 60, world=3, rendezvous_connections=1, training_connections=0,
                  kinds=("impersonate",), seed=1, pg_timeout_s=2)
    assert rec["accepted"] == 0 and rec["ok"], json.dumps({k: v for k, v in rec.items() if k != "log"}, default=str)
    # it got as far as the proof (its Hello speaks the current protocol), and that is where it was refused
    assert any("failed authentication" in why for why in rec["rejected_for"]), rec["rejected_for"]


def test_a_stalled_handshake_does_not_block_rendezvous():
    # a client that sends 3 bytes of a handshake and holds the connection through rendezvous and training:
    # the job must still rendezvous within its 5 s timeout (handshakes read concurrently, or each bounded
    # by a limit well below the timeout)
    rec = bounded(garbage_trial, 60, world=3, rendezvous_connections=1, training_connections=0,
                  kinds=("stall",), seed=1, pg_timeout_s=5)
    assert rec["ok"], json.dumps({k: v for k, v in rec.items() if k != "log"}, default=str)


def test_a_broadcast_with_different_roots_is_detected():
    # rank 0 calls broadcast(root 0), rank 1 broadcast(root 1): both believe they are the root
    rec = bounded(mismatch_trial, 60, world=2, kind="broadcast_root", victim=1, n=1000, pg_timeout_s=3)
    assert rec["detected"], json.dumps({k: v for k, v in rec.items() if k != "log"}, default=str)
