"""`mccl plan` from a saved profile, without torch: the argument errors (each names the option and the bad
text), the profile file's round trip and its errors, and the files a plan writes, checked against a
hand-computed step."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from lightning_mccl.cli import main
from lightning_mccl.quantities import parse_goodput, parse_hosts
from lightning_mccl.plan.profile import FORMAT, Kernels, Param, PowerSGDCost, Profile, ProfileError, load, save


def make_profile(batch=8) -> Profile:
    # two 25 MB matrices, ready at 200 and 300 ms; backward ends at 300 ms, the step at 310 ms
    params = (Param("head.weight", (2500, 2500), 4, 0.2), Param("body.weight", (2500, 2500), 4, 0.3))
    kernels = Kernels(bf16_encode=1e-12, bf16_decode=2e-12, pseudo_gradient=5e-12, outer_step=6e-12,
                      powersgd={1: PowerSGDCost(0.001, 0.002, 0.003)})
    return Profile(model="vit_test", model_args={"img_size": 32}, batch=batch, device="mps",
                   device_name="Apple M2 Ultra's GPU", share_device=1, steps=10, warmup=3, optimizer="SGD",
                   forward_s=0.1, backward_s=0.3, step_s=0.31, params=params, kernels=kernels,
                   machine={"host": "studio-01"})


@pytest.fixture
def profile_file(tmp_path):
    path = str(tmp_path / "studio.json")
    save(make_profile(), path)
    return path


def test_hosts_take_a_range_a_list_or_both():
    assert parse_hosts("1-48") == list(range(1, 49))
    assert parse_hosts("2,4,8,24") == [2, 4, 8, 24]
    assert parse_hosts("1-4,8, 4,16") == [1, 2, 3, 4, 8, 16]


@pytest.mark.parametrize("text, why", [
    ("8-2", "'8-2': the range 8-2 ends before it starts"),
    ("0-4", "'0-4': host counts start at 1, got 0"),
    ("2,x,4", "'2,x,4': 'x' is not a host count or a range; write a range such as 1-48"),
    ("1-", "'1-': '1-' is not a host count or a range"),
    ("1-100000", "at most 4096 hosts"),
])
def test_a_bad_hosts_value_is_named(profile_file, capsys, text, why):
    assert main(["plan", "--profile", profile_file, "--hosts", text]) == 2
    err = capsys.readouterr().err
    assert "argument --hosts" in err and why in err


def test_goodput_in_bits_or_bytes():
    assert parse_goodput("9.4gbit") == pytest.approx(9.4e9 / 8)
    assert parse_goodput("1.17GB/s") == pytest.approx(1.17e9)
    assert parse_goodput("800MB/s") == pytest.approx(8e8)


@pytest.mark.parametrize("args, why", [
    (["--goodput", "fast"], "argument --goodput: 'fast': write a rate such as 9.4gbit or 1.17GB/s"),
    (["--rate", "10 furlongs"], "argument --rate: rate '10 furlongs': write it as tc does"),
    (["--methods", "ddp,fp8"], "argument --methods: 'ddp,fp8': methods are ddp, bf16, int8, powersgd, diloco"),
    (["--batch", "16"], "--batch 16, but the profile"),
    (["--model", "resnet50"], "--model resnet50, but the profile"),
    (["--device", "cuda"], "--device cuda, but the profile"),
    (["--powersgd-rank", "4"], "not at rank 4: profile again with --powersgd-ranks 4"),
    (["--sync-every", "4", "--sync-delay", "5"], "sync_delay must be between 1 and sync_every (4), got 5"),
    (["--diloco-wire", "fp8"], "argument --diloco-wire: invalid choice: 'fp8'"),
    (["--methods", "diloco", "--fragments", "999"], "fragments=999 is more than the model's"),
    (["--fragments", "0"], "argument --fragments: must be at least 1, got 0"),
    (["--fragments", "Auto"], "argument --fragments: 'Auto' is not an integer"),
    (["--compute-scale", "0"], "argument --compute-scale: must be positive, got 0"),
])
def test_bad_arguments_are_named(profile_file, capsys, args, why):
    assert main(["plan", "--profile", profile_file] + args) == 2
    assert why in capsys.readouterr().err


def test_without_a_profile_it_needs_a_model_and_a_batch(capsys):
    assert main(["plan", "--batch", "8"]) == 2
    assert "give --model and --batch (to measure a profile here) or --profile FILE" in capsys.readouterr().err


def test_the_profile_round_trips(tmp_path):
    path = str(tmp_path / "p.json")
    save(make_profile(), path)
    assert load(path) == make_profile()
    with open(path) as f:
        data = json.load(f)
    assert (data["format"], data["version"]) == (FORMAT, 1)
    scaled = load(path).scaled(0.5)
    assert (scaled.step_s, scaled.params[0].ready_s, scaled.compute_scale) == (0.155, 0.1, 0.5)
    assert scaled.kernels.powersgd[1] == PowerSGDCost(0.0005, 0.001, 0.0015)
    assert scaled.kernels.bf16_decode == 1e-12


@pytest.mark.parametrize("content, why", [
    ("{", "not JSON"),
    ('{"format": "something else"}', f"not a {FORMAT}"),
    (json.dumps({"format": FORMAT, "version": 99}), "version 99, this lightning-mccl reads version 1"),
    (json.dumps({"format": FORMAT, "version": 1, "model": "m"}), "a field is missing or malformed"),
])
def test_a_bad_profile_file_is_named(tmp_path, capsys, content, why):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["plan", "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"profile {path}" in err and why in err


def test_a_profile_whose_times_are_out_of_order_is_refused(tmp_path):
    data = make_profile().to_json()
    data["params"][0][3] = 0.5  # a gradient ready after the backward pass
    with pytest.raises(ProfileError, match="gradients ready outside the backward pass: head.weight"):
        Profile.from_json(data, "p.json")
    assert main(["plan", "--profile", str(tmp_path / "missing.json")]) == 2


def test_a_plan_writes_its_table_csv_png_and_profile(profile_file, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["plan", "--profile", profile_file, "--hosts", "1,2,4", "--goodput", "1GB/s", "--op-latency-us",
                 "0", "--step-latency-us", "0", "--bucket-mb", "100", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "vit_test, batch 8 per Mac" in printed and "Apple M2 Ultra's GPU" in printed
    with open(out / "plan.csv") as f:
        rows = {(int(r["hosts"]), r["method"]): r for r in csv.DictReader(f)}
    assert len(rows) == 3 * 5
    # DDP, one 100 MiB bucket of 50 MB, ready at 300 ms; 4 hosts: 75 MB at 1 GB/s, then the 10 ms optimizer step
    assert float(rows[4, "ddp"]["step_s"]) == pytest.approx(0.3 + 0.075 + 0.01)
    assert float(rows[4, "ddp"]["speedup"]) == pytest.approx(4 * 0.31 / 0.385)
    assert float(rows[1, "bf16"]["step_s"]) == 0.31
    assert rows[2, "ddp"]["device_name"] == "Apple M2 Ultra's GPU"
    assert (out / "plan.png").stat().st_size > 0 and "| hosts | ddp |" in (out / "plan.md").read_text()
    assert load(str(out / "profile.json")) == make_profile()


def test_planning_from_a_profile_loads_no_torch(profile_file, tmp_path):
    code = (f"import sys; from lightning_mccl.cli import main; "
            f"rc = main(['plan', '--profile', {profile_file!r}, '--hosts', '2', '--out', {str(tmp_path)!r}]); "
            f"print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stderr


def _plan(tmp_path, capsys, profile, *args):
    path = str(tmp_path / "p.json")
    save(profile, path)
    out = tmp_path / "out"
    assert main(["plan", "--profile", path, "--hosts", "1,4", "--out", str(out), *args]) == 0
    printed = capsys.readouterr()
    with open(out / "plan.csv") as f:
        steps = {(int(r["hosts"]), r["method"]): float(r["step_s"]) for r in csv.DictReader(f)}
    return printed, (out / "plan.md").read_text(), steps


def _md_row(md: str, title: str) -> list:
    line = next(line for line in md.splitlines() if line.startswith(f"| {title} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_the_key_comes_before_the_table_and_each_method_has_its_measured_accuracy(tmp_path, capsys):
    # DiLoCo as measured in bf16: H = 4, the whole model (the defaults, H = 3 in fragments, only in float32)
    printed, md, steps = _plan(tmp_path, capsys, make_profile(), "--sync-every", "4", "--fragments", "1")
    out = " ".join(printed.out.split())  # rich wraps long lines
    for text, header in ((out, "┃ hosts"), (md, "| hosts |")):  # the key, then the table
        assert text.index("each cell: step ms, samples/s, efficiency, speed-up over one Mac") < text.index(header)
        assert text.index("accuracy*: final validation accuracy against float32 DDP") < text.index("reference")
        assert "measured on the project's benchmark task (a ViT from random weights, 8 ranks), not on your " \
               "model" in text
        assert "benchmarks/record/convergence.md#results" in text
    assert _md_row(md, "accuracy*") == ["reference", "-0.09 ± 0.17", "-0.07 ± 0.23", "-32.6 ± 3.3", "-12.4 ± 5.2"]
    # time to DDP's accuracy on the largest fleet: as many steps as DDP for bf16 and int8 (their curves followed
    # DDP's), so their step over DDP's; none for PowerSGD and DiLoCo, which the record never saw get there
    times = _md_row(md, "time to accuracy*")
    assert times[0] == "1.00x" and times[3:] == ["-", "-"]
    assert times[1:3] == [f"{steps[4, m] / steps[4, 'ddp']:.2f}x" for m in ("bf16", "int8")]
    assert "time to accuracy*: the time to reach DDP's accuracy on 4 hosts" in out
    assert "powersgd: no time to accuracy: still -32.6 ± 3.3 points after 256 steps: the steps it needs were not " \
           "measured" in out
    assert "WARNING" not in out + printed.err and "per Mac" in out


def test_the_accuracy_row_follows_the_settings_and_the_methods_asked(tmp_path, capsys):
    _, md, _ = _plan(tmp_path, capsys, make_profile(), "--methods", "powersgd,diloco", "--diloco-wire", "float32",
                     "--sync-every", "2", "--fragments", "1")
    assert _md_row(md, "accuracy*") == ["-32.6 ± 3.3", "-5.8 ± 2.6 (256 steps), -1.8 ± 0.1 (1024 steps), "
                                                       "-0.99 ± 0.37 (2048 steps)"]
    assert _md_row(md, "time to accuracy*") == ["-", "-"]  # DDP's step is planned for the ratio, not shown
    _, md, _ = _plan(tmp_path, capsys, make_profile(), "--methods", "diloco", "--diloco-wire", "int8")
    assert _md_row(md, "accuracy*") == ["not measured"]
    _, md, _ = _plan(tmp_path, capsys, make_profile(), "--methods", "diloco", "--diloco-wire", "float32",
                     "--fragments", "2")  # the profile's 2 tensors, a fragment each: not measured at H = 4
    assert _md_row(md, "accuracy*") == ["not measured"]
    assert "in 2 allreduces, one fragment of the model each, on the round's staggered steps" in md
    # the default, "auto": min(H, the profile's 2 tensors), the same 2 fragments, said so
    _, md, _ = _plan(tmp_path, capsys, make_profile(), "--methods", "diloco", "--diloco-wire", "float32")
    assert _md_row(md, "accuracy*") == ["not measured"]
    assert ("in 2 allreduces (fragments auto: min(H, the model's 2 parameter tensors)), one fragment of the model "
            "each") in md


def test_the_default_diloco_row_is_h_fragments_or_one_a_tensor(tmp_path, capsys):
    """--fragments auto (the default, the strategy's): min(H, the profile's tensors), here its 2 tensors at H = 4
    and H at H = 1 (the whole model: one allreduce at the round's end)."""
    steps = {}
    for given in ([], ["--fragments", "auto"], ["--fragments", "2"], ["--fragments", "1"]):
        steps[" ".join(given)] = _plan(tmp_path, capsys, make_profile(), "--methods", "diloco", *given)[2]
    assert steps[""] == steps["--fragments auto"] == steps["--fragments 2"] != steps["--fragments 1"]
    _, md, _ = _plan(tmp_path, capsys, make_profile(), "--methods", "diloco", "--sync-every", "1")
    assert "in one allreduce at the round's end (fragments auto: min(H, the model's 2 parameter tensors))" in md


@pytest.mark.parametrize("device, name", [("cpu", "Intel Xeon"), ("cuda", "NVIDIA H200")])
def test_a_profile_not_measured_on_a_macs_gpu_is_warned_about_and_not_called_a_mac(tmp_path, capsys, device, name):
    from dataclasses import replace

    printed, md, _ = _plan(tmp_path, capsys, replace(make_profile(), device=device, device_name=name))
    warning = (f"the profile was measured on {name} ({device}), not on a Mac's GPU (mps): every step, samples/s, "
               f"efficiency and speed-up below is that device's compute, not a Mac's")
    out = " ".join(printed.out.split())  # rich wraps long lines
    assert f"WARNING: {warning}" in out and out.index("WARNING") < out.index("┃ hosts")
    assert f"[warning] {warning}" in " ".join(printed.err.split())
    assert f"WARNING: {warning}" in md and md.index("WARNING") < md.index("| hosts |")
    assert "per Mac" not in out + md and "over one Mac" not in out + md
    assert "batch 8 per host" in out and "speed-up over one host" in out
    # scaled to stand for a Mac: still said, with the assumption
    printed, _, _ = _plan(tmp_path, capsys, replace(make_profile(), device=device, device_name=name),
                          "--compute-scale", "0.5")
    assert "its times x0.5 (--compute-scale: an assumption about a Mac)" in " ".join(printed.out.split())
