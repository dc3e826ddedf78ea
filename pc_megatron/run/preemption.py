"""Runs that a scheduler may stop: SIGTERM (what SLURM, Kubernetes and ``kill`` send first) and SIGUSR1
(what SLURM sends ahead of the kill with ``--signal=USR1@120``).

The first signal is noted and the current step finishes; the loop then saves a checkpoint
(``checkpoint.on_signal``, the precedent being Megatron-LM's ``--exit-signal-handler``) and stops with
``RunStopped``, unwinding every part of the run (engines, reward workers, Ray) on the way out; the
CLI prints the resume command and exits 128 + the signal's number. A second signal abandons the
step at once (as Ctrl-C does); the last checkpoint stays intact.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

from pc_megatron.errors import UserError
from pc_megatron.files import atomic_write_text

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class RunStopped(UserError):
    """The run stopped on a signal, after a clean step (and a checkpoint when asked)."""

    def __init__(self, signum: int, run_dir: Path, step: int, saved: bool) -> None:
        name = signal.Signals(signum).name
        where = f"checkpoint at step {step}" if saved else "no new checkpoint (checkpoint.on_signal=false)"
        super().__init__(
            f"stopped by {name} after step {step}; {where}; resume with `pc-megatron train --resume {run_dir}`"
        )
        self.signum = signum


class StopRequests:
    """While entered (on the main thread): the first SIGTERM/SIGUSR1 sets ``signum``; a second one
    raises ``KeyboardInterrupt`` wherever the run is."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nreceived {signal.Signals(signum).name}: finishing this step, then stopping", flush=True)

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


def record_processes(run_dir: Path) -> list[int]:
    """Every live descendant of this process, added to ``run_dir/processes.json`` (pid and command):
    what a stopped run must leave behind is none of them."""
    import psutil

    path = run_dir / "processes.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    for child in psutil.Process().children(recursive=True):
        try:
            known[str(child.pid)] = " ".join(child.cmdline())[:200]
        except psutil.Error:
            continue
    known.pop(str(os.getpid()), None)
    atomic_write_text(path, json.dumps(known, indent=1))
    return [int(p) for p in known]
