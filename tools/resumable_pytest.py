"""pytest that a stuck test cannot take down: each test gets a deadline, and a run that a test ended is
started again without the tests already done, until every test has an outcome (or the budget is spent).
The outcomes go to a Markdown table as they come, so a call cut short still leaves one.

    python tools/resumable_pytest.py --timeout 120 --budget 200 --table OUT/gpu_tests.md -- -m gpu tests

Each test's start and outcome are written by ``tests/progress_plugin.py`` (``PCM_TEST_LOG``); a test
past ``--timeout`` seconds is recorded as timed out and its process ends; the next run deselects it
and every test that finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def outcomes(log: Path) -> dict[str, dict]:
    """Test id -> its last outcome row; a test started and never ended: ``{"outcome": "killed"}``."""
    out: dict[str, dict] = {}
    if not log.is_file():
        return out
    for line in log.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        if row["event"] == "start":
            out.setdefault(row["test"], {"outcome": "killed", "why": "its process ended first"})
        else:
            out[row["test"]] = row
    return out


def table(results: dict[str, dict]) -> str:
    label = {"passed": "ran, passed", "failed": "ran, FAILED", "error": "ERROR", "skipped": "skipped"}
    rows = ["| test | result | why |", "|---|---|---|"]
    for test, row in results.items():
        why = str(row.get("why", "")).replace("|", "/")
        rows.append(f"| {test} | {label.get(row['outcome'], row['outcome'])} | {why} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a test may take")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for all the runs together")
    ap.add_argument("--table", type=Path, required=True, help="the Markdown table of outcomes")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's arguments")
    args = ap.parse_args(argv)
    extra = [a for a in args.pytest_args if a != "--"]
    log = args.table.with_suffix(".jsonl")
    log.unlink(missing_ok=True)
    env = {**os.environ, "PCM_TEST_LOG": str(log), "PCM_TEST_TIMEOUT_S": str(args.timeout)}
    t0, runs, rc = time.monotonic(), 0, 0
    while True:
        done = outcomes(log)
        left = args.budget - (time.monotonic() - t0)
        if left <= 5:
            print(f"resumable_pytest: budget spent after {runs} run(s)", flush=True)
            break
        deselect = [f"--deselect={t}" for t in done]
        plugins = ["-p", "tests.progress_plugin", "-p", "no:cacheprovider"]
        cmd = [sys.executable, "-m", "pytest", *plugins, *extra, *deselect]
        runs += 1
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=left).returncode
        except subprocess.TimeoutExpired:
            print("resumable_pytest: budget spent mid-run", flush=True)
            break
        args.table.write_text(table(outcomes(log)))
        if rc != 124:  # not ended by a test's deadline: every test that remained has run
            break
    results = outcomes(log)
    args.table.write_text(table(results))
    bad = [t for t, r in results.items() if r["outcome"] in ("failed", "error", "timed out", "killed")]
    print(f"resumable_pytest: {len(results)} test(s) in {runs} run(s); {len(bad)} failed, errored or timed out")
    return 1 if bad else (0 if rc in (0, 5, 124) else rc)


if __name__ == "__main__":
    sys.exit(main())
