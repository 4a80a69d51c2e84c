"""benchmarks/results holds the measurements the record cites, one folder per figure, and nothing else: every
entry is a folder that a page of the record (benchmarks/README.md, benchmarks/record/*.md,
benchmarks/gpu_host/README.md), README.md or a page of docs/ names, with a README.md that gives its date and
command. Older results live in git's history (benchmarks/record/performance-log.md says where)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _documents() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
             *sorted((ROOT / "benchmarks" / "record").glob("*.md")), ROOT / "benchmarks" / "gpu_host" / "README.md"]
    return "\n".join(p.read_text() for p in pages)


def _entries():
    return sorted(p for p in RESULTS.iterdir() if not p.name.startswith("."))


def test_every_result_folder_is_cited_by_a_document():
    docs = _documents()
    uncited = [p.name for p in _entries() if not re.search(rf"(?<![\w-]){re.escape(p.name)}(?![\w-])", docs)]
    assert not uncited, (f"benchmarks/results/ entries no document cites (cite them next to their figure in "
                         f"benchmarks/record/, or `git rm` them: git's history keeps them): {uncited}")


def test_every_result_is_a_folder_with_its_date_and_command():
    for p in _entries():
        assert p.is_dir(), f"benchmarks/results/{p.name}: one folder per figure, with a README.md"
        readme = (p / "README.md").read_text() if (p / "README.md").exists() else ""
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", readme), f"{p.name}/README.md gives no date (YYYY-MM-DD)"
        assert re.search(r"\b(python3?|bash|make)\s", readme), f"{p.name}/README.md gives no command"
