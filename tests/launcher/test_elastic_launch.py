"""`mccl launch --elastic`, `mccl leave` and `mccl join`: bad input refused with a message naming the cause (in
process), --leave-on-login reaching the ranks, and real elastic jobs of tests/elastic/elastic_rank.py (torch's
DDP over the elastic group) under the installed `mccl` script: a member killed with SIGKILL mid-step below
--min-nodes 3 (the job ends with the one clear line and rank 0's exit code), and, over the fake ssh, a host whose
rank was killed started again as a joiner once it answers ssh. The launcher's lines for a kill the job survives,
`mccl leave` and `mccl join` are checked with Lightning fits in tests/elastic/test_lightning.py."""
from __future__ import annotations

import os
import re
import signal
from dataclasses import replace

import pytest

from cli_runner import env_with_fake_ssh
from elastic_job import ElasticJob, elastic_job, needs_proc  # noqa: F401 (fixture)
from lightning_mccl.cli import main
from lightning_mccl.launcher import free_port
from lightning_mccl.launcher.elastic import elastic_plan
from lightning_mccl.launcher.launch_plan import LEAVE_ON_LOGIN_VAR, local_plan

STEPS = 36  # elastic_rank.py's 3 epochs of 12 steps
PAUSE_AT = 5


@pytest.mark.parametrize("args, message", [
    (["launch", "--local", "3", "--min-nodes", "2", "--", "true"],
     "--min-nodes 2 needs --elastic (without it, the first rank to exit ends the job)"),
    (["launch", "--local", "3", "--elastic", "--min-nodes", "0", "--", "true"],
     "argument --min-nodes: must be at least 1, got 0"),
    (["launch", "--local", "3", "--elastic", "--min-nodes", "4", "--", "true"],
     "--min-nodes 4 is more than the 3 ranks of --local 3: the job would end at once"),
    (["launch", "--local", "2", "--nproc-per-node", "2", "--elastic", "--min-nodes", "3", "--", "true"],
     "--min-nodes 3 is more than the 2 nodes of --local 2: the job would end at once"),
    (["launch", "--hostfile", "{fleet}", "--elastic", "--min-nodes", "4", "--", "true"],
     "--min-nodes 4 is more than the 3 hosts of {fleet}: the job would end at once"),
    (["launch", "--local", "3", "--leave-on-login", "--", "true"],
     "--leave-on-login needs --elastic (without it, a rank that leaves ends the job)"),
    (["launch", "--local", "3", "--elastic", "--max-restarts", "1", "--", "true"],
     "--max-restarts restarts every rank after a failure, --elastic goes on without the failed one: give one of them"),
    (["leave", "--hostfile", "{fleet}", "mac-9"],
     "mac-9 is not a host of {fleet} (its hosts: mac-0, mac-1, mac-2) nor a member id (m<rank>, j<k>)"),
    (["leave", "--hostfile", "{fleet}", "mac-0"],
     "mac-0 runs m0, host 0's member: it serves the job's Store and must stay for the whole job"),
    (["leave", "--master", "127.0.0.1:29500", "mac-1"], "mac-1 is not a member id (m<rank>, j<k>"),
    (["leave", "--master", "127.0.0.1", "m1"], "argument --master: '127.0.0.1' is not ADDR:PORT"),
    (["join", "--hostfile", "{fleet}", "mac-0", "--", "true"],
     "mac-0 is host 0 of {fleet}: it serves the job's Store, so it cannot join a running job"),
    (["join", "--hostfile", "{fleet}", "mac-7", "--", "true"],
     "mac-7 is not a host of {fleet} (its hosts: mac-0, mac-1, mac-2)"),
    (["join", "--hostfile", "{fleet}", "--", "true"], "give the HOST of {fleet} whose ranks join (one of mac-0, mac-1"),
    (["join", "--local", "1", "--", "true"], "--local needs --master-port: the running job's port"),
])
def test_bad_elastic_input_exits_2_naming_the_cause(tmp_path, capsys, args, message):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("hosts:\n" + "".join(f"  - {{name: mac-{i}, addr: 127.0.0.{i + 1}}}\n" for i in range(3)))
    assert main([a.format(fleet=fleet) for a in args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message.format(fleet=fleet) in err, err


def test_leave_on_login_reaches_every_rank_of_an_elastic_job_and_its_joiners():
    plan = elastic_plan(local_plan(2, ["python", "train.py"], master_port=29500), None, "--local 2")
    assert LEAVE_ON_LOGIN_VAR not in plan.rank_env(0, 0, {})
    plan = replace(plan, leave_on_login=True)
    assert all(plan.rank_env(0, r, {})[LEAVE_ON_LOGIN_VAR] == "1" for r in range(2))
    assert replace(plan, joining="local").rank_env(0, 0, {})[LEAVE_ON_LOGIN_VAR] == "1"
    # never copied from the launcher's own environment: the flag decides
    assert LEAVE_ON_LOGIN_VAR not in replace(plan, leave_on_login=False).rank_env(0, 0, {LEAVE_ON_LOGIN_VAR: "1"})


def test_leave_names_the_address_when_the_store_cannot_be_reached(capsys):
    port = free_port()
    assert main(["leave", "--master", f"127.0.0.1:{port}", "--timeout", "2", "m1"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"cannot reach the job's Store at 127.0.0.1:{port} (timeout 2 s): Connection refused" in err, err


def _kill_member_2(job: ElasticJob) -> None:
    job.await_file("paused")  # m2 waits in its step; m0 and m1 wait for it in the step's allreduce
    os.kill(job.member_pid(2), signal.SIGKILL)


@pytest.mark.slow
@needs_proc
def test_fewer_members_than_min_nodes_end_the_job_with_one_clear_line(elastic_job):
    job = elastic_job(3, "--min-nodes", "3", PAUSE_MEMBER="m2", PAUSE_AT=PAUSE_AT)
    _kill_member_2(job)
    assert job.wait() == 1, job.output()  # rank 0's: it raised TooFewMembers
    last = job.stderr().strip().splitlines()[-1]
    assert last.startswith(
        "mccl: the elastic job ended because fewer members remain than its minimum (--min-nodes); rank 0 on local "
        "exited with code 1; its first error: lightning_mccl.elastic.errors.TooFewMembers: mccl elastic: the job "
        f"ends at step {PAUSE_AT} (round "), last
    assert re.search(r"2 members remain, fewer than the minimum of 3 \(removed: m2: a collective failed on it and "
                     r"its heartbeat stopped \([0-9.]+ s\)\)$", last), last
    assert not list(job.out.glob("m*.json")), "no member finished training"


@pytest.mark.slow
@needs_proc
def test_over_ssh_a_host_whose_rank_was_killed_is_started_again_as_a_joiner(elastic_job, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("hosts:\n" + "".join(f"  - {{name: mac-{i}, addr: 127.0.0.1}}\n" if i == 0 else
                                          f"  - {{name: mac-{i}, addr: 127.0.0.{i + 1}}}\n" for i in range(3)))
    job = elastic_job(0, "--hostfile", str(fleet), env=env_with_fake_ssh(), PAUSE_MEMBER="m2", PAUSE_AT=PAUSE_AT,
                      STEP_SLEEP=0.5)  # the steps after the kill leave the joiner time to start
    _kill_member_2(job)
    assert job.wait() == 0, job.output()
    err = job.stderr()
    assert "mccl: mac-2 left (its ranks exited with code 137): starting it again as a joiner once it answers ssh" \
        in err, job.output()
    assert "mccl: mac-2 answers ssh again: starting it as a joiner (1 rank; restart 1 of at most 3)" in err, err
    assert "[mac-0 r0] mccl elastic: step 5: m2 left (a collective failed on it" in job.stdout(), job.output()
    assert "j1 joined; 3 members now: m0, m1, j1" in job.stdout(), job.output()
    assert err.strip().splitlines()[-1].startswith("mccl: the elastic job finished with 3 members (m0, m1, j1); "
                                                   "changes: step 5: m2 left ("), err
    assert job.result("j1")["steps"] == job.result("m0")["steps"] == STEPS
