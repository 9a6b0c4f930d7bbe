"""The full adversarial run of issue 24: every property test of ``tests/test_properties.py``
at its full size (>= 10,000 generated cases in all), one entry point per process, then a
table of outcomes per entry point -- cases, finite results, typed errors, failures by kind,
hangs -- and every distinct failure with its smallest case.

    python benchmarks/adversarial.py                       # the full run (~20 min on one core)
    python benchmarks/adversarial.py --minutes 5 --entries fit_gp predict
    python benchmarks/adversarial.py --record run.jsonl --table-only   # re-tabulate a run

Each entry point runs in its own process (``pytest -n 0``, one core) that appends one JSON
line per case to the record file; a case still open when its process died (the per-case
watchdog ends a process stuck in compiled code) is counted as a hang. ``--minutes`` caps
each entry point's wall time (the cases not reached are not generated).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = ("kernels", "likelihoods", "fit_gp", "fit_svgp", "fit_sgpr", "sample_gibbs",
           "predict", "sklearn_fit", "sklearn_predict", "persistence", "cli")


def run_entry(entry: str, record: Path, minutes: float | None, timeout_s: int) -> int:
    env = dict(os.environ, AGP_PROPERTY_FULL="1", AGP_PROPERTY_RECORD=str(record),
               AGP_PROPERTY_TIMEOUT=str(timeout_s), AUGMENTEDGP_BLAS_THREADS="1",
               OMP_NUM_THREADS="1", AUGMENTEDGP_COMPILATION_CACHE="1",
               JAX_COMPILATION_CACHE_DIR=str(record.with_suffix(".jax-cache")),
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    if minutes:
        env["AGP_PROPERTY_STOP_AT"] = str(time.time() + 60 * minutes)
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider",
           "--no-header", f"tests/test_properties.py::test_{entry}_full"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: the test's own "zero failures" assertion
        tail = (proc.stdout + proc.stderr)[-2000:]
        print(f"[{entry}] pytest exited {proc.returncode}:\n{tail}", file=sys.stderr)
    return proc.returncode


def load_records(record: Path) -> dict[str, list[dict]]:
    """The cases of each entry point; a start with no end is a hang (its process died)."""
    cases: dict[str, list[dict]] = collections.defaultdict(list)
    open_case: dict[str, dict] = {}
    for line in record.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        entry = event["entry"]
        if event["event"] == "start":
            if entry in open_case:  # the previous one never ended: its process was killed
                cases[entry].append({**open_case[entry], "kind": "hang",
                                     "detail": "process killed", "message": "", "where": ""})
            open_case[entry] = event
        else:
            open_case.pop(entry, None)
            cases[entry].append(event)
    for entry, event in open_case.items():
        cases[entry].append({**event, "kind": "hang", "detail": "process killed",
                             "message": "", "where": ""})
    return cases


def table(cases: dict[str, list[dict]]) -> str:
    rows = ["| entry point | cases | finite | typed error | failures (by kind) | hangs |",
            "|---|---:|---:|---:|---|---:|"]
    total = collections.Counter()
    for entry in [e for e in ENTRIES if e in cases] + sorted(set(cases) - set(ENTRIES)):
        c = collections.Counter(x["kind"] for x in cases[entry])
        kinds = collections.Counter(x["detail"] for x in cases[entry] if x["kind"] == "failure")
        fails = ", ".join(f"{k}: {v}" for k, v in kinds.most_common()) or "0"
        rows.append(f"| {entry} | {len(cases[entry])} | {c['finite']} | {c['typed']} | "
                    f"{sum(kinds.values())} ({fails}) | {c['hang']} |")
        total.update(c)
        total["cases"] += len(cases[entry])
    rows.append(f"| **all** | {total['cases']} | {total['finite']} | {total['typed']} | "
                f"{total['failure']} | {total['hang']} |")
    return "\n".join(rows)


def distinct_failures(cases: dict[str, list[dict]]) -> str:
    """One line per (entry point, kind, source location, message head), with the count and
    the shortest case."""
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for entry, items in cases.items():
        for x in items:
            if x["kind"] in ("failure", "hang"):
                head = " ".join(str(x.get("message", "")).split()[:8])
                groups[(entry, x["detail"], x.get("where", ""), head)].append(x)
    out = []
    for (entry, detail, where, head), items in sorted(groups.items()):
        smallest = min(items, key=lambda x: len(x["case"]))
        out.append(f"- {entry}: {detail} at {where or '?'} x{len(items)}: {head}\n"
                   f"  case: {smallest['case']}")
    return "\n".join(out) or "(none)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", nargs="*", default=list(ENTRIES), choices=ENTRIES)
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-time cap per entry point (default: none)")
    parser.add_argument("--timeout", type=int, default=60, help="per-case timeout (s)")
    parser.add_argument("--record", type=Path, default=Path("adversarial-run.jsonl"))
    parser.add_argument("--table-only", action="store_true",
                        help="tabulate an existing record file, run nothing")
    args = parser.parse_args(argv)
    if not args.table_only:
        for entry in args.entries:
            t0 = time.time()
            code = run_entry(entry, args.record.resolve(), args.minutes, args.timeout)
            print(f"[{entry}] done in {time.time() - t0:.0f} s (pytest exit {code})",
                  file=sys.stderr, flush=True)
    cases = load_records(args.record)
    print(table(cases))
    print("\nDistinct failures (entry point: kind at source x count: message; smallest case):")
    print(distinct_failures(cases))


if __name__ == "__main__":
    main()
