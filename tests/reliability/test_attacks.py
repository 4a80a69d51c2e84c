"""What the engine does not withstand yet (each a strict xfail: it turns into a failure the day the engine
withstands it, so that the mark is removed then). Reproducers for the lead; see NOTES-rel.md."""
from __future__ import annotations

import json

import pytest

from conftest import bounded
from reliability.garbage_trials import garbage_trial


@pytest.mark.xfail(strict=True, reason="no authentication yet: a client with the communicator id is taken for a rank")
def test_an_impersonating_client_is_refused():
    rec = bounded(garbage_trial, 60, world=3, rendezvous_connections=1, training_connections=0,
                  kinds=("impersonate",), seed=1, pg_timeout_s=3)
    assert rec["accepted"] == 0 and rec["ok"], json.dumps({k: v for k, v in rec.items() if k != "log"}, default=str)


@pytest.mark.xfail(strict=True, reason="accepted sockets are blocking on Linux: a stalled handshake blocks rendezvous")
def test_a_stalled_handshake_does_not_block_rendezvous():
    rec = bounded(garbage_trial, 60, world=3, rendezvous_connections=1, training_connections=0,
                  kinds=("stall",), seed=1, pg_timeout_s=3)
    assert rec["ok"], json.dumps({k: v for k, v in rec.items() if k != "log"}, default=str)
