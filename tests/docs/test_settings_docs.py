"""The variables tables of docs/settings.md (*Every variable*) and the README (*Variables*) against the engine's
table (csrc/engine/config.cc, as `lightning_mccl._C.variables()` returns it): docs/settings.md lists every
variable the engine declares, and every row of either names a declared variable with its declared default, or a
variable the Python layer reads (src/lightning_mccl). A failure prints the row the engine's table implies."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict:
    from lightning_mccl.backend import extension as _C

    return {v["name"]: v for v in _C.variables()}


def _table(path: Path, heading: str) -> dict:
    """{variable: default as the table writes it} from the first table under `heading` ("" for "(unset)")."""
    text = "\n" + path.read_text()
    start = text.index(f"\n{heading}\n")
    section = text[start + len(heading) + 2:]
    section = section[:section.find("\n## ")] if "\n## " in section else section
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `MCCL_") or len(cells) < 3:
            continue
        default = re.match(r"`([^`]*)`", cells[1])
        assert default or cells[1] == "(unset)", f"{path.name}: {line[:80]}: the default is `value` or (unset)"
        for name in re.findall(r"`(MCCL_[A-Z0-9_]+)`", cells[0]):
            rows[name] = default.group(1) if default else ""
    assert rows, f"{path.name} has no variables table under {heading!r}"
    return rows


def _read_by_python(name: str) -> bool:
    return any(f'"{name}"' in p.read_text() for p in (ROOT / "src" / "lightning_mccl").rglob("*.py"))


def _row(v: dict) -> str:
    default = f"`{v['default']}`" if v["default"] else "(unset)"
    return f"| `{v['name']}` | {default} | {v['doc']} |"


def _check(rows: dict, declared: dict, where: str) -> None:
    for name, default in rows.items():
        if name in declared:
            assert default == declared[name]["default"], (
                f"{where}: {name}'s default is {default or '(unset)'!r}, the engine's "
                f"{declared[name]['default'] or '(unset)'!r} (csrc/engine/config.cc): {_row(declared[name])}")
        else:
            assert _read_by_python(name), f"{where}: {name} is neither in the engine's table nor read in src/"


def test_settings_md_lists_every_declared_variable_with_its_default():
    declared = _declared()
    rows = _table(ROOT / "docs" / "settings.md", "## Every variable")
    missing = [_row(v) for name, v in declared.items() if name not in rows]
    assert not missing, "docs/settings.md, *Every variable*, lacks:\n" + "\n".join(missing)
    _check(rows, declared, "docs/settings.md")


def test_readme_variables_agree_with_the_engine():
    rows = _table(ROOT / "README.md", "## Variables")
    _check(rows, _declared(), "README.md")


@pytest.mark.parametrize("row, error", [
    ("| `MCCL_SPIN_US` | `5` | x |", "MCCL_SPIN_US's default is '5', the engine's 'auto'"),
    ("| `MCCL_SPINUS` | `50` | x |", "MCCL_SPINUS is neither in the engine's table nor read in src/"),
])
def test_the_check_fails_on_a_wrong_row(tmp_path, row, error):
    doc = tmp_path / "doc.md"
    doc.write_text(f"## Variables\n\n| variable | default | meaning |\n|---|---|---|\n{row}\n")
    with pytest.raises(AssertionError, match=re.escape(error)):
        _check(_table(doc, "## Variables"), _declared(), "doc.md")
