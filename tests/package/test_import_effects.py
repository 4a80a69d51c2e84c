"""Every import-time side effect of lightning_mccl lives in one file, registration.py.

A child process records, with the innermost frame of lightning_mccl that caused it, every change to
`sys.meta_path`, to `os.environ` and to Lightning's two strategy registries, while it imports the package,
torch and Lightning, loads every lazy name of the package, makes each strategy and a `MacFleetEnvironment` from
a hostfile that names an interface (which once wrote MCCL_SOCKET_IFNAME), and registers again with Lightning's
MPS accelerator reported available (the gate is installed then). Every change made from lightning_mccl code
must come from registration.py; and the MPS gate is in place only in that last step.

Also: no `global` statement in src/ (test_import_rules.py: no module of src/ reads a file while it is imported).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "lightning_mccl"

CHILD = textwrap.dedent("""
    import json, os, sys, tempfile, traceback

    events = []

    def site():
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/lightning_mccl/" in frame.filename:
                return frame.filename.split("/lightning_mccl/", 1)[1]
        return None

    def record(what):
        where = site()
        if where is not None:
            events.append([what, where])

    class MetaPath(list):
        def _change(name):
            def change(self, *args, **kwargs):
                record("sys.meta_path")
                return getattr(list, name)(self, *args, **kwargs)
            return change
        for _name in ("insert", "append", "extend", "remove", "pop", "clear", "__setitem__", "__delitem__"):
            locals()[_name] = _change(_name)

    sys.meta_path = MetaPath(sys.meta_path)
    Environ = type(os.environ)
    for _name in ("__setitem__", "__delitem__"):
        def change(self, *args, _original=getattr(Environ, _name), _what=_name):
            record("os.environ")
            return _original(self, *args)
        setattr(Environ, _name, change)

    import lightning_mccl
    import torch
    import lightning.fabric.strategies.registry as registry

    original = registry._StrategyRegistry.__setitem__
    def setitem(self, key, value):
        record("strategy registry")
        return original(self, key, value)
    registry._StrategyRegistry.__setitem__ = setitem

    import lightning.pytorch
    import lightning_mccl.lightning as ll
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
    for name in ll.__all__:
        getattr(ll, name)
    for name in ("ProcessGroupMCCL", "stats", "timeline", "clock_ns", "is_registered", "register"):
        getattr(lightning_mccl, name)
    ll.MCCLStrategy(compress="bf16"); ll.MCCLDiLoCoStrategy(); ll.MCCLFabricStrategy()
    hostfile = os.path.join(tempfile.mkdtemp(), "fleet.yaml")
    with open(hostfile, "w") as f:
        f.write("master_port: 29500\\nhosts:\\n  - {name: a, addr: 127.0.0.1, ifname: lo}\\n")
    os.environ["MCCL_NODE_RANK"] = "0"
    env = ll.MacFleetEnvironment(hostfile)
    before_gate = getattr(_AcceleratorConnector._check_config_and_set_final_flags, "_mccl_gate", False)
    import lightning.fabric.accelerators.mps as mps
    mps.MPSAccelerator.is_available = staticmethod(lambda: True)
    from lightning_mccl import registration
    registration.register_lightning()
    after_gate = getattr(_AcceleratorConnector._check_config_and_set_final_flags, "_mccl_gate", False)
    print(json.dumps({"events": events, "gate": [before_gate, after_gate], "ifname": env.ifname,
                      "socket_ifname_set": "MCCL_SOCKET_IFNAME" in os.environ}))
""")


def test_import_time_effects_come_from_registration_only():
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("MCCL_", "MASTER_", "WORLD_"))}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    kinds = {what for what, _ in out["events"]}
    assert kinds == {"sys.meta_path", "strategy registry"}, out["events"]  # the tracer saw each kind it watches
    elsewhere = sorted({(what, where) for what, where in out["events"] if where != "registration.py"})
    assert not elsewhere, elsewhere
    assert out["gate"] == [False, True]  # the MPS gate: only where MPS is available
    assert out["ifname"] == "lo" and out["socket_ifname_set"] is False  # read by the group, not written


def test_no_global_statement_in_src():
    globals_ = [f"{p.relative_to(SRC)}:{n.lineno}" for p in sorted(SRC.rglob("*.py"))
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Global)]
    assert not globals_, globals_
