"""Citations a user can resolve.

Every citation in the package sources, the docs and the README names an entry of
docs/references.md by its key in square brackets -- ``[Wenzel2019, eq. 12]``,
``[Galy-Fajou2022, Sec. 7.2.1]`` -- and nothing points at material a user does not have:
the documents the library was written from ("seed 001", their extraction notes and
"errata", the project's private design guide) or "the thesis" without saying which one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"
TEXT_SUFFIXES = {".py", ".md", ".txt", ".rst", ".toml", ".cfg", ".json"}

# A key: surname(s) with capitals and hyphens, a year, an optional letter (Galy-Fajou2020b).
KEY = r"[A-Z][A-Za-z]*(?:-[A-Z][A-Za-z]*)*(?:19|20)\d\d[a-z]?"
CITED = re.compile(rf"\[({KEY})[,\]]")
DEFINED = re.compile(rf"^- \*\*\[({KEY})\]\*\*", re.M)

# Never allowed: pointers to the private source documents and notes.
FORBIDDEN = [
    (re.compile(r"seed ?0\d\d", re.I), "a source document by its seed number"),
    (re.compile(r"\.\./shared"), "a path outside the repository"),
    (re.compile(r"DESIGN\.md"), "the private design guide"),
    (re.compile(r"reference §"), "a section of the extraction notes"),
]
# Allowed only next to a key (same line or the line before): "thesis" and "errata" must say
# whose, and appendix-style numbers (A.6, B.6.2) must say of which work.
NEEDS_KEY = [
    (re.compile(r"\bthes[ie]s\b", re.I), "'thesis' without a bibliography key"),
    (re.compile(r"\berrat(?:a|um)\b", re.I), "'errata' without a bibliography key"),
    (re.compile(r"(?<![\w.])[A-H]\.\d+(?:\.\d+)?\b"), "an appendix-style section without a key"),
]


def cited_files() -> list[Path]:
    src = [p for p in sorted((ROOT / "src" / "augmentedgp").rglob("*"))
           if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *src]


def defined_keys() -> list[str]:
    return DEFINED.findall(REFERENCES.read_text())


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_bibliography_keys_are_unique_and_parseable():
    keys = defined_keys()
    assert len(keys) >= 20, "docs/references.md lists too few entries (format changed?)"
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    assert not dupes, f"keys defined twice in docs/references.md: {dupes}"


def test_bibliography_is_linked():
    assert "references.md" in (ROOT / "docs" / "index.md").read_text()
    assert "docs/references.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("path", cited_files(), ids=_rel)
def test_citations_resolve(path):
    """Every [Key, ...] in the file is an entry of docs/references.md, and no line points
    at the unpublished source documents or cites a thesis, errata or appendix-style section
    without a key."""
    known = set(defined_keys())
    lines = path.read_text(encoding="utf-8").splitlines()
    problems = []
    for i, line in enumerate(lines):
        where = f"{_rel(path)}:{i + 1}"
        for key in CITED.findall(line):
            if key not in known:
                problems.append(f"{where}: [{key}] is not in docs/references.md")
        for pattern, what in FORBIDDEN:
            if pattern.search(line):
                problems.append(f"{where}: cites {what}: {line.strip()}")
        context = (lines[i - 1] if i else "") + " " + line
        for pattern, what in NEEDS_KEY:
            if pattern.search(line) and not CITED.search(context):
                problems.append(f"{where}: {what}: {line.strip()}")
    assert not problems, "unresolvable citations:\n" + "\n".join(problems)


def test_checker_is_not_vacuous():
    known = set(defined_keys())
    assert {"Wenzel2019", "Galy-Fajou2020", "Galy-Fajou2022", "Rasmussen2006"} <= known
    assert CITED.findall("see [Wenzel2019, eq. 12] and [Galy-Fajou2020b]") == [
        "Wenzel2019", "Galy-Fajou2020b"]
    assert not CITED.findall("x[M2] + a[i] [N, 2]")
    bad = "(seed 001 eq. 3.5)", "see ../shared/x", "DESIGN.md", "reference §9"
    for text in bad:
        assert any(p.search(text) for p, _ in FORBIDDEN), text
    assert NEEDS_KEY[0][0].search("thesis ch. 5") and NEEDS_KEY[2][0].search("(B.6.2)")
    assert not NEEDS_KEY[2][0].search("version 1.2.3 and e.g. 4.5")
