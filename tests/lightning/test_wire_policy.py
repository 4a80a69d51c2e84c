"""The wire policy (lightning_mccl/wire_policy.py) is the one home of every `compress` decision: its values are
string literals there and nowhere else in src/, the bucket sizes are declared there once, and its resolution
gives each value's behaviour on each device and backend (the table of its docstring)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lightning_mccl import wire_policy
from lightning_mccl.wire_policy import ALLREDUCE, CAST, CAST_MEAN, EIGHT_BIT, INT8_MEAN, LOW_RANK, resolve

SRC = Path(__file__).resolve().parents[2] / "src" / "lightning_mccl"
HOME = SRC / "wire_policy.py"


def _constants(path: Path):
    """(line, value) of every constant in `path` but docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and id(node) not in docstrings]


def test_the_compress_values_are_literals_of_the_policy_module_only():
    values = set(wire_policy.CHOICES)
    assert values == {"bf16", "fp16", "bf16_hook", "fp16_hook", "powersgd", "int8"}
    found = {f"{path.relative_to(SRC)}:{line}: {value!r}" for path in sorted(SRC.rglob("*.py")) if path != HOME
             for line, value in _constants(path) if value in values}
    assert not found, "compress values written outside wire_policy.py (read them from there):\n" + "\n".join(found)
    assert {v for _, v in _constants(HOME)} >= values


def test_the_bucket_sizes_are_declared_once():
    """No module of src/ but the policy assigns a number to a name about buckets; `mccl plan` reads the rows."""
    import importlib

    predict = importlib.import_module("lightning_mccl.plan.predict")

    assigned = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, (int, float)) and not isinstance(node.value.value, bool):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                assigned += [(path.name, n) for n in names if "BUCKET" in n]
    assert {f for f, _ in assigned} == {"wire_policy.py"}, assigned
    assert (predict.BUCKET_MB, predict.INT8_BUCKET_MB, predict.POWERSGD_BUCKET_MB) == (
        wire_policy.ROWS[None].bucket_mb, wire_policy.ROWS["int8"].bucket_mb, wire_policy.ROWS["powersgd"].bucket_mb)
    assert predict.POWERSGD_RANK == wire_policy.POWERSGD_DEFAULTS["matrix_approximation_rank"]


# compress: {(device, backend): (wire, hook, cast, bucket MB)} for DDP
DDP = {
    None: {("cpu", "mccl"): (None, None, None, 5.0), ("mps", "mccl"): (None, None, None, 5.0),
           ("cpu", "gloo"): (None, None, None, None)},
    "bf16": {("cpu", "mccl"): ("bf16", None, None, 5.0), ("mps", "mccl"): (None, CAST, "bf16", 5.0),
             ("cuda", "mccl"): (None, CAST, "bf16", 5.0), ("cpu", "gloo"): (None, CAST, "bf16", None)},
    "fp16": {("cpu", "mccl"): ("fp16", None, None, 5.0), ("mps", "mccl"): (None, CAST, "fp16", 5.0)},
    "bf16_hook": {("cpu", "mccl"): (None, CAST, "bf16", 5.0), ("mps", "mccl"): (None, CAST, "bf16", 5.0)},
    "fp16_hook": {("cpu", "mccl"): (None, CAST, "fp16", 5.0)},
    "powersgd": {("cpu", "mccl"): (None, LOW_RANK, None, 1000.0), ("mps", "gloo"): (None, LOW_RANK, None, None)},
    "int8": {("cpu", "mccl"): (None, EIGHT_BIT, None, 25.0), ("mps", "mccl"): (None, EIGHT_BIT, None, 25.0)},
}
# compress: {(device, backend): (the outer group's wire, averaging, cast)} for DiLoCo
DILOCO = {
    None: {("cpu", "mccl"): (None, ALLREDUCE, None), ("mps", "mccl"): (None, ALLREDUCE, None)},
    "bf16": {("cpu", "mccl"): ("bf16", ALLREDUCE, None), ("mps", "mccl"): (None, CAST_MEAN, "bf16"),
             ("cpu", "gloo"): (None, CAST_MEAN, "bf16")},
    "fp16": {("cuda", "mccl"): (None, CAST_MEAN, "fp16")},
    "int8": {("cpu", "mccl"): (None, INT8_MEAN, None), ("mps", "mccl"): (None, INT8_MEAN, None)},
}


@pytest.mark.parametrize("compress", list(DDP))
def test_ddp_resolution(compress):
    for (device, backend), want in DDP[compress].items():
        r = resolve(compress, device, backend, "MCCLStrategy")
        assert (r.wire, r.hook, r.cast, r.bucket_mb) == want, (compress, device, backend)


@pytest.mark.parametrize("compress", list(DILOCO))
def test_diloco_resolution(compress):
    for (device, backend), want in DILOCO[compress].items():
        r = resolve(compress, device, backend, "MCCLDiLoCoStrategy", diloco=True)
        assert (r.wire, r.averaging, r.cast, r.hook) == (*want, None), (compress, device, backend)


def test_refusals_name_the_owner_and_the_value():
    with pytest.raises(ValueError, match=r"^MCCLStrategy\(compress='int4'\): expected one of \('bf16'"):
        resolve("int4", "cpu", "mccl", "MCCLStrategy")
    with pytest.raises(ValueError, match=r"^X\(compress='int8'\) needs process_group_backend='mccl'"):
        resolve("int8", "cpu", "gloo", "X")
    for hook_only in ("bf16_hook", "fp16_hook", "powersgd"):
        with pytest.raises(ValueError, match=rf"^D\(compress='{hook_only}'\): DiLoCo's pseudo-gradients travel as"):
            resolve(hook_only, "cpu", "mccl", "D", diloco=True)


def test_the_strategies_annotations_list_the_table():
    import typing

    assert typing.get_args(wire_policy.Compress) == wire_policy.CHOICES
    assert typing.get_args(wire_policy.DiLoCoCompress) == ("bf16", "fp16", "int8")
