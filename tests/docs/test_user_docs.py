"""The user documents speak to users; the record of how each figure was measured lives with the benchmarks.

The user documents are README.md and every page of docs/ (the record is benchmarks/README.md and
benchmarks/record/, which may keep dates, runs and the issues that asked for them). Their prose (outside code
blocks, inline code and link targets, where `allreduce #9` or an anchor such as `#2026-12-02` is not a
reference) names no issue (`issue 27`, `#27`), no date of a run, and no session history ("this session", "the
VM's day"). Every relative link of the user documents and of the record resolves: the file exists and, for a
markdown page, has the heading the anchor names (GitHub's anchors)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORD = [ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "record").glob("*.md")),
          ROOT / "benchmarks" / "gpu_host" / "README.md"]

FORBIDDEN = [
    (re.compile(r"\bissues?\s+#?\d+", re.I), "an issue number"),
    (re.compile(r"(?<![\w&/])#\d+\b"), "an issue number"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date (runs and their dates belong in benchmarks/record/)"),
    (re.compile(r"\bthis session\b|\bthe VM's day\b|\bin an earlier (?:run|call)\b", re.I), "session history"),
]


def _prose(text: str) -> str:
    """The text a reader sees as prose: fenced and indented code blocks, inline code, link targets and bare
    URLs blanked out (newlines kept, so line numbers stay)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", blank, text, flags=re.M | re.S)
    text = re.sub(r"(?:(?<=\n\n)|^)(?: {4}[^\n]*\n?)+", blank, text)
    text = re.sub(r"`[^`]*`", blank, text)
    text = re.sub(r"\]\([^)]*\)", blank, text)
    return re.sub(r"https?://\S+", blank, text)


def _offences(text: str) -> list:
    prose = _prose(text)
    found = []
    for pattern, what in FORBIDDEN:
        for m in pattern.finditer(prose):
            line = prose.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {what}: {text.splitlines()[line - 1].strip()[:100]!r}")
    return found


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_documents_name_no_issue_date_or_session(path):
    offences = _offences(path.read_text())
    assert not offences, f"{path.relative_to(ROOT)} (move history to benchmarks/record/):\n" + "\n".join(offences)


@pytest.mark.parametrize("text, caught", [
    ("Issue 28's target, at most 100 us.", True),
    ("the targets of issue #27", True),
    ("a fix for #12 landed", True),
    ("measured on 2026-12-04, twice", True),
    ("4 KiB takes 100-220 us (the VM's day)", True),
    ("`MCCL collective mismatch: rank 1 called allreduce\n#3 of 12 float32`", False),
    ("```\nissue 27\n```", False),
    ("the record ([log](benchmarks/record/performance-log.md#2026-12-02))", False),
    ("one issue at a time, 16 bytes in issue order", False),
])
def test_the_check_catches_history_and_spares_code(text, caught):
    assert bool(_offences(text)) == caught, (text, _offences(text))


def _slug(heading: str) -> str:
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


def _anchors(path: Path) -> set:
    anchors, seen = set(), {}
    for line in _prose_headings(path.read_text()):
        slug = _slug(line)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _prose_headings(text: str):
    in_code = False
    for line in text.splitlines():
        if line.startswith(("```", "~~~")):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6}\s+(.*)", line)):
            yield m.group(1)


@pytest.mark.parametrize("path", USER_DOCS + RECORD, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no such heading in {resolved.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)
