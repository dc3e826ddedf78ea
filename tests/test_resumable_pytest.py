"""``tools/resumable_pytest.py`` with ``tests/progress_plugin.py``: a test that hangs past its deadline is
recorded as timed out, and the tests after it still run (the device check's table survives a stuck test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = """
import time

def test_a_first():
    assert True

def test_b_hangs():
    time.sleep(120)

def test_c_after():
    assert 1 + 1 == 2

def test_d_fails():
    assert 1 == 2, "one is not two"
"""


def test_a_stuck_test_is_timed_out_and_the_rest_still_run(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    table = tmp_path / "out" / "table.md"
    table.parent.mkdir()
    cmd = [sys.executable, str(ROOT / "tools" / "resumable_pytest.py"), "--timeout", "4", "--budget", "90",
           "--table", str(table), "--", "-q", str(tmp_path / "test_cases.py")]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    rows = {line.split(" | ")[0].split("::")[-1]: line for line in table.read_text().splitlines()[2:]}
    assert "ran, passed" in rows["test_a_first"] and "ran, passed" in rows["test_c_after"], table.read_text()
    assert "timed out" in rows["test_b_hangs"] and "past 4 s" in rows["test_b_hangs"]
    assert "ran, FAILED" in rows["test_d_fails"] and "one is not two" in rows["test_d_fails"]
    assert done.returncode == 1 and "in 2 run(s)" in done.stdout, done.stdout + done.stderr
