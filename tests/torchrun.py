"""The parallel learner's worker (``tests/workers/parallel_worker.py``) under torchrun, over gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.settings import WORKERS


def torchrun(out: Path, nproc: int, args: list, env: dict | None = None) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*cmd, str(WORKERS / "parallel_worker.py"), str(out), *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
