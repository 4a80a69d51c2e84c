"""What `mccl launch` shows when ranks fail: one copy of an error every rank prints alike (same_lines), one line
for each rank stopped after another failed (quiet_stop), and the first failure's error line in the launcher's
last line (error_line); the stages on their own, then the installed script on rank programs (no torch)."""
from __future__ import annotations

import os

from cli_runner import RANK_PROGRAMS, run_mccl
from lightning_mccl.launcher import RankSpec, SameLines, first_error
from rank_programs import USAGE, USAGE_ERROR
from test_launch import prefixed

LIGHTNING_CLI_ERROR = """\
usage: vit_finetune.py [options] fit [-c CONFIG]
tip: For details of accepted options run: vit_finetune.py fit --help
error: Parser key "trainer.strategy":
  Does not validate against any of the Union subtypes
  Errors:
    - Expected a <class 'str'>
    - Problem with given class_path 'lightning_mccl.lightning.MCCLStrategy':
        Parser key "compress":
          Does not validate against any of the Union subtypes
          Errors:
            - Expected a typing.Literal['bf16', 'fp16', 'bf16_hook', 'fp16_hook', 'powersgd']
            - Expected a <class 'NoneType'>
          Given value type: <class 'str'>
          Given value: bf17
  Given value type: <class 'dict'>
""".splitlines()

TRACEBACK = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 9, in <module>
[rank0]:     trainer.fit(model)
[rank0]:     ~~~~~~~~~~~^^^^^^^
[rank0]: torch.distributed.DistBackendError: MCCL error: rank 0 lost rank 1 (10.0.0.12:29601): connection reset
[rank0]: 
[rank0]: During handling of the above exception, another exception occurred:
[rank0]: Traceback (most recent call last):
[rank0]: KeyboardInterrupt""".splitlines()


def test_first_error_of_a_parser_a_traceback_and_nothing():
    assert first_error(LIGHTNING_CLI_ERROR) == (
        "error: Parser key \"compress\": Expected a typing.Literal['bf16', 'fp16', 'bf16_hook', 'fp16_hook', "
        "'powersgd']; given value: bf17")
    assert first_error(["Epoch 0: 10/10", *TRACEBACK]) == (
        "torch.distributed.DistBackendError: MCCL error: rank 0 lost rank 1 (10.0.0.12:29601): connection reset")
    assert first_error(["usage: x.py [-h]", "x.py: error: argument --lr: invalid float value: 'fast'"]) == (
        "x.py: error: argument --lr: invalid float value: 'fast'")
    assert first_error(["all good", "Traceback (most recent call last):"]) is None  # cut off
    assert first_error([]) is None


class Lines:
    def __init__(self):
        self.got = []

    def line(self, spec, text):
        self.got.append((spec.label, text))


def test_same_lines_shows_a_text_once_per_time_it_was_printed():
    r0, r1, r2 = (RankSpec(r, "mac", ()) for r in range(3))
    out = Lines()
    same = SameLines(out)
    for spec, text in [(r0, "a"), (r1, "a"), (r1, "b"), (r0, "b"), (r2, "a"), (r0, "a"), (r1, "a"), (r1, "c"),
                       (r0, "x")]:
        same.line(spec, text)
    same.rank_exited(r2, 2)
    same.finish()
    assert out.got == [
        ("mac r0", "a"), ("mac r1", "(1 line as mac r0 printed it above, not shown; MCCL_DEBUG=INFO shows them)"),
        ("mac r1", "b"),
        ("mac r0", "(1 line as mac r1 printed it above, not shown; MCCL_DEBUG=INFO shows them)"),
        ("mac r0", "a"),  # rank 0's second "a": shown once so far
        ("mac r1", "(1 line as mac r0 printed it above, not shown; MCCL_DEBUG=INFO shows them)"), ("mac r1", "c"),
        ("mac r0", "x"),
        ("mac r2", "(1 line as mac r0 printed it above, not shown; MCCL_DEBUG=INFO shows them)"),  # at its exit
    ]


def test_an_error_every_rank_prints_alike_is_shown_once_and_named_last(tmp_path):
    r = run_mccl("launch", "--local", "3", "--", "python", RANK_PROGRAMS, "usage", tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    block = USAGE + USAGE_ERROR
    for text in block:  # one copy of each line, whichever rank's it was
        assert sum(line.split("] ", 1)[1] == text for line in r.stdout.splitlines()) == 1, r.stdout
    out = prefixed(r.stdout)
    held = [(label, lines) for label, lines in out.items() if lines[0].startswith(f"({len(block)} lines as local r")]
    assert len(held) == 2, r.stdout  # the two ranks whose copy was not shown: one line each, and their stop
    for label, lines in held:
        assert len(lines) <= 2 and all(t.startswith("stopped by the launcher after rank ") for t in lines[1:]), lines
    assert r.stderr.splitlines()[-1].endswith(
        "exited with code 2; its first error: error: Parser key \"compress\": Expected a Literal['bf16']; "
        "given value: bf17"), r.stderr


def test_after_a_kill_9_the_other_ranks_show_one_line_not_their_tracebacks(tmp_path):
    r = run_mccl("launch", "--local", "2", "--", "python", RANK_PROGRAMS, "killed", tmp_path)
    assert r.returncode == 137, r.stdout + r.stderr
    assert "rank 1 on local exited with code 137 (killed by SIGKILL); stopping the other 1 rank" in r.stderr
    assert "Traceback" not in r.stdout, r.stdout
    (line,) = prefixed(r.stdout)["local r0"]
    assert line.startswith("stopped by the launcher after rank 1 failed (exit code 1); ") and line.endswith(
        "lines of its shutdown not shown (the first error: RuntimeError: rank 1 closed its connection), "
        "MCCL_DEBUG=INFO shows them"), line
    (tmp_path / "verbose").mkdir()  # MCCL_DEBUG=INFO shows everything
    r = run_mccl("launch", "--local", "2", "--", "python", RANK_PROGRAMS, "killed", tmp_path / "verbose",
                 env={**os.environ, "MCCL_DEBUG": "INFO"})
    assert prefixed(r.stdout)["local r0"].count("Traceback (most recent call last):") == 2, r.stdout
