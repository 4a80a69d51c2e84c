"""benchmarks/results holds the measurements the documents cite, one folder per figure, and nothing else: every
entry is a folder that README.md or a page of docs/ names, with a README.md that gives its date and command.
Older results live in git's history (docs/performance-log.md says where)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _documents() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _entries():
    return sorted(p for p in RESULTS.iterdir() if not p.name.startswith("."))


def test_every_result_folder_is_cited_by_a_document():
    docs = _documents()
    uncited = [p.name for p in _entries() if not re.search(rf"(?<![\w-]){re.escape(p.name)}(?![\w-])", docs)]
    assert not uncited, (f"benchmarks/results/ entries no document cites (cite them next to their figure in "
                         f"docs/, or `git rm` them: git's history keeps them): {uncited}")


def test_every_result_is_a_folder_with_its_date_and_command():
    for p in _entries():
        assert p.is_dir(), f"benchmarks/results/{p.name}: one folder per figure, with a README.md"
        readme = (p / "README.md").read_text() if (p / "README.md").exists() else ""
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", readme), f"{p.name}/README.md gives no date (YYYY-MM-DD)"
        assert re.search(r"\b(python3?|bash|make)\s", readme), f"{p.name}/README.md gives no command"
