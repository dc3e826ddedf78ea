"""The embedded task's starting point: the tiny policy's SFT warm-start (shipped with the package
for the default recipe, else computed once into the cache) and the RL pool chosen under it
(``data.synthetic.pool``: hard, easy or graded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pc_megatron.data.task import Task
from pc_megatron.pools import select_pool
from pc_megatron.warmstart import ensure_warm_start


def prepare_embedded(cfg: Any, task: Task, progress: bool = True) -> tuple[Task, Path]:
    policy_dir = ensure_warm_start(cfg, task, progress=progress)
    return select_pool(cfg, task, policy_dir, progress=progress), policy_dir
