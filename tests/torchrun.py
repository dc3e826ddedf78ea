"""The parallel learner's worker (``tests/workers/parallel_worker.py``) under torchrun, over gloo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.settings import WORKERS


def torchrun(out: Path, nproc: int, args: list, env: dict | None = None, timeout: float = 600) -> None:
    """Run the worker on ``nproc`` ranks; a run past ``timeout`` seconds (a collective that some rank
    never joins) is killed with all its ranks and fails the test."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [*cmd, str(WORKERS / "parallel_worker.py"), str(out), *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the ranks go with it on a timeout
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        what = f"torchrun ({nproc} ranks, {args[2:3]}) did not finish within {timeout} s"
        raise AssertionError(f"{what}\n{err[-3000:]}") from late
    assert proc.returncode == 0, err[-4000:]
