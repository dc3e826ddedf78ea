"""``pc-megatron score FILE --reward NAME``: a reward over completions a user already has, the way
training scores them (the same worker pool, timeouts and failure counts), before any GPU is spent.

Rows in (JSONL): ``id``, ``completion``, ``answer``. Rows out (JSONL, same order): each row with
``score`` and ``correct`` added, and ``failed`` (``timeout`` / ``error``) where the reward did not
finish. Returns the summary (printed as one line by the CLI).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pc_megatron.data.dataset import iter_jsonl
from pc_megatron.errors import DataError
from pc_megatron.rewards.config import RewardConfig
from pc_megatron.rewards.pool import RewardPool

FIELDS = ("id", "completion", "answer")


def read_completions(path: Path) -> list[dict]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = []
    for lineno, obj in iter_jsonl(path):
        if not isinstance(obj, dict) or any(k not in obj for k in FIELDS):
            raise DataError(f"{path}:{lineno}: every row needs {list(FIELDS)}")
        if not isinstance(obj["completion"], str):
            raise DataError(f"{path}:{lineno}: 'completion' must be a string")
        rows.append(obj)
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def score_file(path: Path, cfg: RewardConfig, out: Path | None, chunk: int = 512, progress: bool = True) -> dict:
    from tqdm import tqdm

    rows = read_completions(path)
    t0 = time.perf_counter()
    timeouts = errors = 0
    with RewardPool(cfg) as pool, tqdm(total=len(rows), desc="scoring", disable=not progress) as bar:
        for a in range(0, len(rows), chunk):
            part = rows[a : a + chunk]
            # one call per chunk: progress shows, and a broken reward is caught on its first chunk
            res = pool.score(
                [r["completion"] for r in part], [str(r["answer"]) for r in part], [str(r["id"]) for r in part]
            )
            timeouts, errors = timeouts + res.timeouts, errors + res.errors
            for k, (r, s) in enumerate(zip(part, res.results, strict=True)):
                r["score"], r["correct"] = s.score, s.correct
                if k in res.failed:
                    r["failed"] = res.failed[k]
            bar.update(len(part))
    seconds = time.perf_counter() - t0
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    n = len(rows)
    return {
        "rows": n,
        "accuracy": sum(bool(r["correct"]) for r in rows) / n,
        "mean_score": sum(r["score"] for r in rows) / n,
        "timeouts": timeouts,
        "errors": errors,
        "seconds": seconds,
        "per_second": n / seconds,
    }
