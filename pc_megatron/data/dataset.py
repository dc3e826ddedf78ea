"""Load prompt rows from JSONL or Parquet, validating every row.

A row is an object with at least ``id``, ``prompt`` and ``answer`` (the format of real math
sets such as DeepMath or Polaris after the usual flattening). Extra fields are kept in
``meta``. A malformed row raises ``DataError`` naming the file, the line (1-based, for Parquet
the row number) and the reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pc_megatron.errors import DataError

REQUIRED = ("id", "prompt", "answer")


@dataclass(frozen=True)
class PromptRow:
    id: str
    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


def _validate(obj: Any, where: str) -> PromptRow:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with keys {list(REQUIRED)}, got {type(obj).__name__}")
    missing = [k for k in REQUIRED if k not in obj or obj[k] is None]
    if missing:
        raise DataError(f"{where}: missing field(s) {missing}; every row needs {list(REQUIRED)}")
    if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
        raise DataError(f"{where}: 'prompt' must be a non-empty string")
    for key in ("id", "answer"):
        if not isinstance(obj[key], (str, int)) or isinstance(obj[key], bool):
            raise DataError(f"{where}: '{key}' must be a string or an integer, got {type(obj[key]).__name__}")
    meta = {k: v for k, v in obj.items() if k not in REQUIRED}
    return PromptRow(id=str(obj["id"]), prompt=obj["prompt"], answer=str(obj["answer"]), meta=meta)


def _read_jsonl(path: Path) -> list[PromptRow]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            rows.append(_validate(obj, f"{path}:{lineno}"))
    return rows


def _read_parquet(path: Path) -> list[PromptRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    missing = [k for k in REQUIRED if k not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; every row needs {list(REQUIRED)}")
    return [_validate(obj, f"{path}:row {i + 1}") for i, obj in enumerate(table.to_pylist())]


def load_rows(path: str | Path) -> list[PromptRow]:
    """Read and validate all rows; duplicate ids are an error (ids key the scheduler state)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: dataset file not found; set data.train_path / data.eval_path to an existing file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = _read_jsonl(path)
    elif suffix == ".parquet":
        rows = _read_parquet(path)
    else:
        raise DataError(f"{path}: unsupported extension '{suffix}'; use .jsonl or .parquet")
    if not rows:
        raise DataError(f"{path}: the file has no rows")
    seen: set[str] = set()
    for i, row in enumerate(rows, start=1):
        if row.id in seen:
            raise DataError(f"{path}: row {i} repeats id '{row.id}'; ids must be unique")
        seen.add(row.id)
    return rows


def write_jsonl(rows: list[PromptRow], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # unique: concurrent runs may race
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"id": r.id, "prompt": r.prompt, "answer": r.answer, **r.meta}) + "\n")
    tmp.replace(path)
