"""Who sends the training state to whom: receivers dealt to the holders in turn, so several joiners are served
by several members; the RNG states travel and come back."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lightning_mccl.elastic.state_transfer import plan, rng_states, set_rng_states


def test_receivers_are_dealt_to_the_holders_in_turn():
    assert plan(["m0", "m1", "m2", "j4", "j5", "j6", "j7"], ["j4", "j5", "j6", "j7"]) == {
        "j4": "m0", "j5": "m1", "j6": "m2", "j7": "m0"}
    assert plan(["m0", "m1", "m2"], ["m1", "m2"]) == {"m1": "m0", "m2": "m0"}  # the first boundary: host 0 sends
    assert plan(["m0", "m1"], []) == {}
    with pytest.raises(ValueError, match="no member holds the state"):
        plan(["j1"], ["j1"])


def test_rng_states_round_trip():
    states = rng_states()
    first = (torch.rand(3), random.random(), np.random.rand())
    set_rng_states(states)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]
