"""A Mac whose owner logs in leaves (lightning_mccl.elastic.owner): the watch asks once, and only for a change of
who is logged in at the screen; the console user read from `stat` (canned outputs: not run on a Mac); the
launcher's --leave-on-login reaching the ranks' settings. The leave itself, on real processes: test_churn.py."""
from __future__ import annotations

import subprocess
import time

import pytest

from lightning_mccl.elastic import ElasticSettings
from lightning_mccl.elastic import owner
from lightning_mccl.elastic.owner import OwnerWatch
from lightning_mccl.launcher.launch_plan import LEAVE_ON_LOGIN_VAR, with_launched_settings


def watch(users, interval_s=0.01):
    """An OwnerWatch over the readings `users` (the last one repeats), and what it asked."""
    readings, asked = list(users), []
    w = OwnerWatch(lambda: readings.pop(0) if len(readings) > 1 else readings[0], asked.append, interval_s)
    w.start()
    return w, asked


def settle(w, asked, seconds=0.3):
    deadline = time.monotonic() + seconds
    while not asked and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # a second ask would come now
    w.stop()
    return asked


@pytest.mark.parametrize("users, expected", [
    (["", "", "alice"], ["its owner alice logged in at the console"]),  # the login window, then alice
    (["bob", "bob", "alice"], ["its owner alice logged in at the console"]),  # another user than at the start
    (["bob", "", "bob"], []),  # the one logged in when the job started logged out and in again
    (["", ""], []),  # nobody, all along
    ([None], []),  # off macOS: nothing is watched
])
def test_the_watch_asks_once_for_a_new_user_at_the_screen(users, expected):
    w, asked = watch(users)
    assert settle(w, asked) == expected
    assert w.asked == (expected[0] if expected else None)


@pytest.mark.parametrize("output, code, user", [("alice\n", 0, "alice"), ("root\n", 0, ""), ("", 1, None)])
def test_the_console_user_is_the_owner_of_dev_console_root_meaning_nobody(monkeypatch, output, code, user):
    monkeypatch.setattr(owner.sys, "platform", "darwin")
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, code, stdout=output, stderr="")

    monkeypatch.setattr(owner.subprocess, "run", run)
    assert owner.console_user() == user
    assert calls == [["stat", "-f", "%Su", "/dev/console"]]


def test_off_macos_nobody_is_read(monkeypatch):
    monkeypatch.setattr(owner.sys, "platform", "linux")
    assert owner.console_user() is None


def test_the_launchers_flag_turns_it_on_in_the_ranks_settings():
    assert not ElasticSettings().leave_when_owner_logs_in
    assert with_launched_settings(ElasticSettings(), {LEAVE_ON_LOGIN_VAR: "1"}).leave_when_owner_logs_in
    assert not with_launched_settings(ElasticSettings(), {}).leave_when_owner_logs_in
    with pytest.raises(ValueError, match="owner_poll_s=0 must be positive"):
        ElasticSettings(owner_poll_s=0)
