"""A pytest plugin for runs that may be cut short (``tools/resumable_pytest.py``, the device check): each
test's start and outcome go to a JSON-lines file as they happen, and a test past its deadline is
recorded as timed out and ends the process, which the caller restarts without the tests already done.

    python -m pytest -p tests.progress_plugin ...   # PCM_TEST_LOG=FILE, PCM_TEST_TIMEOUT_S=SECONDS

A stuck test may hang in C (a CUDA synchronise, a collective) where no Python signal reaches it: the
watchdog is a thread that writes the verdict and exits the process, so nothing waits on the test.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

_LOG = os.environ.get("PCM_TEST_LOG")
_TIMEOUT_S = float(os.environ.get("PCM_TEST_TIMEOUT_S", "0") or 0)


def _write(row: dict) -> None:
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def pytest_runtest_logstart(nodeid, location):
    _write({"test": nodeid, "event": "start"})


def pytest_runtest_logreport(report):
    failed_setup = report.when == "setup" and (report.skipped or report.failed)
    if report.when == "call" or failed_setup or (report.when == "teardown" and report.failed):
        why = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            why = str(report.longrepr[2])
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)  # the exception's own message where pytest has it
            text = crash.message if crash is not None else (report.longreprtext or "").strip()
            why = (text.splitlines() or [""])[0]
        outcome = report.outcome if report.when != "teardown" else "error"
        _write({"test": report.nodeid, "event": "end", "outcome": outcome, "why": why[:200]})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timer = None
    if _TIMEOUT_S > 0:

        def expire():
            _write({"test": item.nodeid, "event": "end", "outcome": "timed out", "why": f"past {_TIMEOUT_S:g} s"})
            os._exit(124)

        timer = threading.Timer(_TIMEOUT_S, expire)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
