"""The README's *Layout* matches the tree: every source file of the engine, the binding and the Python package,
every benchmark script and every folder of benchmarks/, tests/ and tools/ is named there, and every folder it
names exists; every page of docs/ is linked from the README, and every page of the record (benchmarks/record/)
from the record's index, benchmarks/README.md, which the README links."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Layout\n"):]
    return section[section.index("```"):section.index("```", section.index("```") + 3)]


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def _stems(folder: str, *patterns: str) -> set:
    return {p.stem for pattern in patterns for p in (ROOT / folder).glob(pattern)
            if not p.name.startswith("__") and p.is_file()}


def test_every_source_file_and_folder_is_in_the_layout():
    layout = _layout()
    names = (_stems("csrc/engine", "*.cc", "*.h") | _stems("csrc/engine/transport", "*.cc", "*.h")
             | _stems("csrc/engine/algorithms", "*.cc", "*.h") | _stems("csrc/torch", "*.cpp", "*.hpp", "*.mm")
             | _stems("src/lightning_mccl", "*.py") | _stems("src/lightning_mccl/lightning", "*.py")
             | _stems("src/lightning_mccl/cli", "*.py") | _stems("src/lightning_mccl/launcher", "*.py")
             | _stems("tools", "*.py"))
    names |= {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    names |= {p.name + "/" for folder in ("benchmarks", "tests", "src/lightning_mccl", "csrc/engine")
              for p in (ROOT / folder).iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    missing = sorted(n for n in names if not _named(n.rstrip("/"), layout))
    assert not missing, f"README.md, *Layout*, does not name: {missing}"


def test_every_folder_the_layout_names_exists():
    layout = _layout()
    roots = re.findall(r"^([\w./]+/)(?:\s|$)", layout, re.M)
    assert "csrc/engine/" in roots and "docs/" in roots, roots
    assert not [r for r in roots if not (ROOT / r).is_dir()], roots
    for line in layout.splitlines():
        for script in re.findall(r"(?<![\w/])([\w]+\.py)\b", line):
            assert list(ROOT.glob(f"**/{script}")), f"README.md, *Layout*, names {script}, which does not exist"


def test_every_document_is_linked_from_the_readme():
    text = (ROOT / "README.md").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name}" not in text]
    assert not missing, f"README.md links no docs/{missing}"


def test_every_record_page_is_linked_from_the_benchmarks_index():
    assert "](benchmarks/README.md" in (ROOT / "README.md").read_text(), "README.md links no benchmarks/README.md"
    index = (ROOT / "benchmarks" / "README.md").read_text()
    missing = [p.name for p in (ROOT / "benchmarks" / "record").glob("*.md") if f"](record/{p.name}" not in index]
    assert not missing, f"benchmarks/README.md links no record/{missing}"
