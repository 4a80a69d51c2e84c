"""The launcher's last line names the project's own error (error_line, peer_loss): the innermost exception the
project raised, not the library's under it (a download that failed: the recipe's message, not
socket.gaierror), the error a class raised inside a LightningCLI instantiation error, not jsonargparse's
wrapper; one copy of a usage text; and a rank that only lost its peer says so in one line, not in a
traceback. Canned output first, then real rank programs (error_rank.py) through `mccl launch`."""
from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_mccl
from lightning_mccl.launcher import RankSpec, first_error
from lightning_mccl.launcher.error_line import RankTails, project_file
from lightning_mccl.launcher.job import failure_line
from lightning_mccl.launcher.peer_loss import PeerLoss
from lightning_mccl.launcher.supervisor import Outcome, RankExit
from test_launch import prefixed

PROGRAM = str(Path(__file__).resolve().parent / "error_rank.py")
SITE = "/home/me/.venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
DOWNLOAD = f"""\
Traceback (most recent call last):
  File "{STDLIB}/urllib/request.py", line 1348, in do_open
    h.request(req.get_method(), req.selector, req.data, headers,
  File "{STDLIB}/socket.py", line 962, in getaddrinfo
    for res in _socket.getaddrinfo(host, port, family, type, proto, flags):
socket.gaierror: [Errno -2] Name or service not known

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{SITE}/torchvision/datasets/utils.py", line 120, in download_url
    _urlretrieve(url, fpath)
  File "{STDLIB}/urllib/request.py", line 1351, in do_open
    raise URLError(err)
urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/home/me/vit/train.py", line 9, in <module>
    trainer.fit(model, datamodule=data)
  File "{SITE}/lightning_mccl/recipes/data.py", line 196, in prepare_data
    raise RuntimeError(
RuntimeError: CIFAR-10 is not in data/cifar10 and downloading it failed (<urlopen error [Errno -2] Name or service \
not known>); copy cifar-10-batches-py/ there, or use dataset=digits, which needs no network""".splitlines()
INSTANTIATION = f"""\
Traceback (most recent call last):
  File "{SITE}/jsonargparse/_typehints.py", line 928, in raise_unexpected_value
    raise ValueError(message) from exception
ValueError: Expected a <class 'str'>. Got value: Namespace(class_path='lightning_mccl.lightning.MCCLStrategy', \
init_args=Namespace(accelerator=None, sync_every=0))

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/home/me/vit/vit_finetune.py", line 41, in main
    cli = ViTCLI(ViTClassifier, ImageDataModule)
  File "{SITE}/jsonargparse/_typehints.py", line 935, in raise_union_unexpected_value
    raise ValueError(
ValueError: Does not validate against any of the Union subtypes
Subtypes: [<class 'str'>, <class 'lightning.pytorch.strategies.strategy.Strategy'>]
Errors:
  - Expected a <class 'str'>
  - MCCLStrategy(sync_every=0): expected the inner steps per round, an int >= 1
Given value type: <class 'jsonargparse._namespace.Namespace'>
Given value: Namespace(class_path='lightning_mccl.lightning.MCCLStrategy', \
init_args=Namespace(sync_every=0))""".splitlines()
LOST_PEER = ("torch.distributed.DistBackendError: MCCL connection error: rank 1 lost its connection to rank 0 "
             "(127.0.0.1:40483) during allreduce #24 of 5 float32 (sum) (Connection closed by peer). That process "
             "probably exited or crashed: look at its log for the first error.")


def test_the_innermost_exception_the_project_raised_is_named():
    assert first_error(DOWNLOAD) == DOWNLOAD[-1]  # the recipe's message, not socket.gaierror
    assert first_error(["[rank0]: " + t for t in DOWNLOAD]) == DOWNLOAD[-1]
    assert project_file("/home/me/vit/train.py") and project_file(f"{SITE}/lightning_mccl/recipes/data.py")
    assert not project_file(f"{STDLIB}/socket.py") and not project_file(f"{SITE}/torchvision/datasets/utils.py")
    # no frame of the project's own: the first exception, as before
    assert first_error(DOWNLOAD[:6]) == "socket.gaierror: [Errno -2] Name or service not known"


def test_a_lightning_cli_instantiation_error_names_the_classs_own_error():
    assert first_error(INSTANTIATION) == "MCCLStrategy(sync_every=0): expected the inner steps per round, an int >= 1"


def test_a_lost_peers_traceback_is_one_line_and_others_are_whole():
    class Lines:
        def __init__(self):
            self.got = []

        def line(self, spec, text):
            self.got.append((spec.rank, text))

    out = Lines()
    stage = PeerLoss(out)
    r0, r1 = RankSpec(0, "mac-0", ()), RankSpec(1, "mac-1", ())
    frames = ["[rank1]:   File \"train.py\", line 9, in <module>", "[rank1]:     trainer.fit(model)"]
    for text in ["[rank1]: Traceback (most recent call last):", *frames, f"[rank1]: {LOST_PEER}"]:
        stage.line(r1, text)
    stage.line(r0, "Traceback (most recent call last):")
    stage.line(r0, "  File \"train.py\", line 9, in <module>")
    for text in ["[rank1]: ", "[rank1]: During handling of the above exception, another exception occurred:",
                 "[rank1]: Traceback (most recent call last):", *frames, "[rank1]: KeyboardInterrupt"]:
        stage.line(r1, text)  # the rest of the chain: left out too
    stage.line(r0, "ValueError: step 3 failed")
    stage.line(r1, "rank 1 goes on")
    assert out.got == [(1, f"{LOST_PEER} (its traceback not shown: it lost a peer; MCCL_DEBUG=INFO shows it)"),
                       (0, "Traceback (most recent call last):"), (0, "  File \"train.py\", line 9, in <module>"),
                       (0, "ValueError: step 3 failed"), (1, "rank 1 goes on")]


def test_when_the_first_rank_to_fail_only_lost_its_peer_the_last_line_also_names_the_cause():
    class Sink:
        def line(self, spec, text):
            pass

    tails = RankTails(Sink())
    r0, r1 = RankSpec(0, "mac-0", ()), RankSpec(1, "mac-1", ())
    for text in ["Traceback (most recent call last):", "  File \"train.py\", line 9", LOST_PEER]:
        tails.line(r1, text)
    for text in ["Traceback (most recent call last):", "  File \"train.py\", line 5", "ValueError: step 3 failed"]:
        tails.line(r0, text)
    failed = RankExit(r1, 1, False)
    assert failure_line(Outcome(1, "failed", (failed,), failed), tails) == (
        f"; its first error: {LOST_PEER}; the cause, rank 0's first error: ValueError: step 3 failed")


# -- real rank programs through the launcher ----------------------------------------------------------------

def _last_line(r) -> str:
    return r.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_project_error_inside_a_lightning_cli_instantiation_is_the_last_line():
    r = run_mccl("launch", "--local", "2", "--", "python", PROGRAM, "cli", "--trainer.strategy",
                 "error_rank.CheckedStrategy", "--trainer.strategy.every", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert _last_line(r).endswith(
        "its first error: CheckedStrategy(every=0): expected the steps per round, an int >= 1"), r.stderr
    assert "Expected a <class 'str'>" not in _last_line(r)


@pytest.mark.slow
def test_a_one_word_typo_shows_one_copy_of_the_usage_and_names_the_word():
    r = run_mccl("launch", "--local", "2", "--", "python", PROGRAM, "cli", "--trainer.max_stepz", "3")
    assert r.returncode == 2, r.stdout + r.stderr
    usage = [line for line in r.stdout.splitlines() if line.split("] ", 1)[1].startswith("usage: ")]
    assert len(usage) == 1, r.stdout  # one copy for the two ranks
    assert _last_line(r).endswith("its first error: error: unrecognized arguments: --trainer.max_stepz 3"), r.stderr


@pytest.mark.slow
def test_a_failed_download_names_the_recipes_message_not_the_socket_error(tmp_path):
    r = run_mccl("launch", "--local", "2", "--", "python", PROGRAM, "cifar", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    last = _last_line(r)
    assert f"its first error: RuntimeError: CIFAR-10 is not in {tmp_path}/cifar10 and downloading it failed" in last
    assert last.endswith("or use dataset=digits, which needs no network") and "gaierror" not in last, last


@pytest.mark.slow
def test_a_rank_that_lost_its_peer_shows_one_line_and_the_cause_is_named():
    r = run_mccl("launch", "--local", "2", "--nproc-per-node", "1", "--", "python", PROGRAM, "peer")
    assert r.returncode == 1, r.stdout + r.stderr
    rank1 = prefixed(r.stdout)["local r1"]
    assert not [t for t in rank1 if t.startswith("[rank1]:")], r.stdout  # no traceback, not even its first line
    assert any("lost its connection to rank 0" in t for t in rank1), rank1  # its one line, or its stop's note
    assert "ValueError: Tiny: step 3 failed on rank 0 on purpose" in _last_line(r), r.stderr
