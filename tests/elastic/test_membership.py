"""The membership rounds over a real TCPStore, each member a thread with its own Store client and heartbeat:
one decision per round, read by every member; failed steps, silent members, members named by an engine error,
leave requests (the member's own and the leave log's), host 0's refused, joiners admitted, the minimum, state
digests that disagree, a live but slow member waited for, and one far behind told so (never deciding alone)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mccl.elastic.board import Board
from lightning_mccl.elastic.errors import Removed
from lightning_mccl.elastic.liveness import Heartbeat
from lightning_mccl.elastic.membership import KEEP_ROUNDS, Membership, Post, request_leave
from lightning_mccl.elastic.settings import ElasticSettings

SETTINGS = ElasticSettings(timeout=20.0, heartbeat_s=0.05, silent_after_s=1.5, suspect_grace_s=0.25)
HOST = "m0"
GLOBAL_BATCH = 12


class World:
    """A Store server and members m0..m<n-1>, each with its own client; heartbeats for the `alive` ones."""

    def __init__(self, n: int, alive=None, settings=SETTINGS):
        self.server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=20), wait_for_workers=False)
        self.members = [f"m{i}" for i in range(n)]
        self.settings = settings
        self.said = []
        self.beats = []
        self.views = {m: self.membership(m, self.members) for m in self.members}
        for m in (self.members if alive is None else alive):
            self.beat(m)

    def client(self) -> dist.TCPStore:
        return dist.TCPStore("127.0.0.1", self.server.port, None, False, timedelta(seconds=20), wait_for_workers=False)

    def board(self, member: str) -> Board:
        return Board(self.client(), member, f"127.0.0.1:{self.server.port}")

    def membership(self, member: str, members) -> Membership:
        return Membership(self.board(member), member, self.settings, members, HOST, self.said.append,
                          global_batch=GLOBAL_BATCH)

    def beat(self, member: str) -> None:
        heartbeat = Heartbeat(self.client, member, "test", self.settings.heartbeat_s)
        heartbeat.start()
        self.beats.append(heartbeat)

    def round(self, posts: dict, delays=None) -> dict:
        """Every member in `posts` posts (after its delay), in parallel; their decisions by member."""
        delays = delays or {}

        def one(m):
            time.sleep(delays.get(m, 0.0))
            return self.views[m].boundary(posts[m])

        with ThreadPoolExecutor(len(posts)) as pool:
            results = dict(zip(posts, pool.map(one, posts)))
        assert len({repr(d) for d in results.values()}) == 1, f"members read different decisions: {results}"
        return results

    def close(self):
        for b in self.beats:
            b.stop()


@pytest.fixture
def world():
    made = []

    def make(*args, **kwargs):
        made.append(World(*args, **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.close()


OK = Post(ok=True, digest="d")


def test_round_zero_admits_everyone_and_sends_host_0s_state_to_the_others(world):
    w = world(3)
    posts = {"m0": OK, "m1": Post(ok=True, has_state=False), "m2": Post(ok=True, has_state=False)}
    d = w.round(posts)["m1"]
    assert (d.round, d.members, d.receivers, d.commit, d.reform, d.end) == (0, ("m0", "m1", "m2"), ("m1", "m2"),
                                                                               False, True, "")
    d = w.round({m: OK for m in w.members})["m0"]
    assert (d.round, d.commit, d.reform, d.reason, d.removed) == (1, True, False, "", {})


def test_a_failed_step_is_committed_by_nobody_and_the_group_re_forms(world):
    w = world(3)
    w.round({m: OK for m in w.members})
    posts = {"m0": OK, "m1": Post(ok=False, why="MCCL connection error: boom", digest="d"), "m2": OK}
    d = w.round(posts)["m2"]
    assert (d.commit, d.reform, d.members) == (False, True, ("m0", "m1", "m2"))
    assert d.reason == "member m1 failed: MCCL connection error: boom"


def test_a_silent_member_is_removed_after_silent_after_s(world):
    w = world(3, alive=["m0", "m1"])
    start = time.monotonic()
    d = w.round({"m0": OK, "m1": OK})["m0"]
    waited = time.monotonic() - start
    assert d.members == ("m0", "m1") and not d.commit and d.reform
    assert "m2" in d.removed and "heartbeat stopped" in d.removed["m2"] and d.left == ()
    assert SETTINGS.silent_after_s <= waited < SETTINGS.silent_after_s + 2.0


def test_a_member_an_engine_error_named_is_removed_after_the_grace(world):
    w = world(3, alive=["m0", "m1"])
    named = Post(ok=False, why="lost its connection to rank 2", suspects=("m2",), digest="d")
    start = time.monotonic()
    d = w.round({"m0": named, "m1": named})["m1"]
    waited = time.monotonic() - start
    assert d.members == ("m0", "m1") and "a collective failed on it" in d.removed["m2"]
    assert SETTINGS.suspect_grace_s <= waited < SETTINGS.silent_after_s


def test_a_named_member_that_is_alive_stays(world):
    w = world(3)
    named = Post(ok=False, why="lost its connection to rank 2", suspects=("m2",), digest="d")
    d = w.round({"m0": named, "m1": named, "m2": OK}, delays={"m2": 0.6})["m0"]
    assert d.members == ("m0", "m1", "m2") and d.removed == {}


def test_a_slow_member_whose_heartbeat_goes_on_is_waited_for(world):
    w = world(2)
    d = w.round({"m0": OK, "m1": OK}, delays={"m1": SETTINGS.silent_after_s + 0.5})["m0"]
    assert d.members == ("m0", "m1") and d.commit is False  # round 0 commits nothing
    assert w.round({"m0": OK, "m1": OK})["m1"].commit


def test_leave_on_request_and_through_the_log_and_host_0_stays(world):
    w = world(4)
    w.round({m: OK for m in w.members})
    request_leave(w.board("cli"), "m3", "mccl leave")
    request_leave(w.board("cli"), "m0", "mccl leave")
    posts = {"m0": OK, "m1": Post(ok=True, leaving="it asked to leave", digest="d"), "m2": OK, "m3": OK}
    d = w.round(posts)["m3"]
    assert d.commit  # the leavers' last step is applied
    assert d.members == ("m0", "m2") and set(d.left) == {"m1", "m3"}
    assert d.removed == {"m1": "it asked to leave", "m3": "mccl leave"}
    assert any("m0 serves the Store on host 0 and must stay" in line for line in w.said)


def test_a_joiner_is_admitted_and_receives_the_state(world):
    w = world(2)
    w.round({m: OK for m in w.members})
    joiner_id = Membership.register_joiner(w.board("joiner"), {"host": "h", "pid": 1})
    assert joiner_id == "j1"
    joiner = w.views[joiner_id] = w.membership(joiner_id, ())
    w.beat(joiner_id)
    joiner.catch_up()
    assert joiner.round == 1  # after the latest decided round, 0
    # The joiner posts first: one that posts after the members completed the quorum is admitted a round later.
    d = w.round({"m0": OK, "m1": OK, "j1": Post(ok=True, has_state=False)}, delays={"m0": 0.3, "m1": 0.3})["j1"]
    assert (d.members, d.receivers, d.commit, d.reform) == (("m0", "m1", "j1"), ("j1",), True, True)
    assert joiner.members == ("m0", "m1", "j1")


def test_fewer_members_than_the_minimum_end_the_job(world):
    w = world(3, alive=["m0", "m1"], settings=ElasticSettings(timeout=20.0, heartbeat_s=0.05, silent_after_s=0.5,
                                                            suspect_grace_s=0.25, min_members=3))
    d = w.round({"m0": OK, "m1": OK})["m0"]
    assert d.too_few and d.end.startswith("2 members remain, fewer than the minimum of 3")


def test_members_whose_state_differs_end_the_job(world):
    w = world(2)
    w.round({m: OK for m in w.members})
    d = w.round({"m0": Post(ok=True, digest="a"), "m1": Post(ok=True, digest="b")})["m1"]
    assert d.end == "members disagree on the training state: m0: a, m1: b" and not d.too_few


def test_the_first_decision_written_is_the_one_everybody_reads(world):
    w = world(2)
    board = w.board("m0")
    assert board.set_once("k", {"v": 1}) == {"v": 1}
    assert w.board("m1").set_once("k", {"v": 2}) == {"v": 1}
    assert board.get("k") == {"v": 1}


def test_a_member_removed_while_alive_learns_it(world):
    w = world(2, alive=["m0"], settings=ElasticSettings(timeout=20.0, heartbeat_s=0.05, silent_after_s=0.3,
                                                        suspect_grace_s=0.2))
    result = {}
    thread = threading.Thread(target=lambda: result.update(m0=w.views["m0"].boundary(OK)))
    thread.start()
    thread.join(10)
    d = w.views["m1"].boundary(OK)  # m1 comes late, its heartbeat never ran: the round went on without it
    assert d == result["m0"] and "m1" in d.removed and "m1" not in d.members


def test_a_member_far_behind_learns_it_was_left_behind(world):
    w = world(2, alive=["m0"], settings=ElasticSettings(timeout=20.0, heartbeat_s=0.05, silent_after_s=0.3,
                                                        suspect_grace_s=0.2))
    for n in range(KEEP_ROUNDS + 2):  # m0 alone after round 0; the first rounds' decisions are deleted
        assert w.views["m0"].boundary(OK).members == ("m0",)
    with pytest.raises(Removed, match=f"member m1 fell more than {KEEP_ROUNDS} step boundaries behind"):
        w.views["m1"].boundary(OK)
