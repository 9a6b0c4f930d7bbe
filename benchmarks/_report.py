"""Report helpers shared by the benchmark scripts: markdown tables, number formatting,
the checkout and CPU descriptions, and rewriting one generated section of RESULTS.md."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt(x, spec=".4f", missing="—"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def checkout() -> str:
    """' (checkout abc1234[, src/ modified])', or '' outside a git checkout."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "src"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" (checkout {commit}{', src/ modified' if dirty else ''})"


def cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def write_results(text: str, begin: str, end: str, path: Path = RESULTS_MD) -> None:
    """Replace the section between the ``begin`` and ``end`` markers (or append it)."""
    section = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + section + ("\n" + tail if tail.strip() else "")
    else:
        new = old.rstrip() + "\n\n" + section
    path.write_text(new)
