"""Load prompt rows from JSONL or Parquet, validating every row.

Two row formats:
- flat: ``id``, ``prompt`` (a string) and ``answer``; extra fields are kept in ``meta``;
- verl's (what its preprocessors write for DeepMath, Polaris, MATH, AIME...): ``prompt`` a list
  of chat messages (``role``, ``content``), ``reward_model.ground_truth`` the answer,
  ``extra_info.index`` the id (else the row number), ``data_source`` and the rest kept in
  ``meta``; the messages are in ``meta["messages"]`` and ``prompt`` is the last user message.
A malformed row raises ``DataError`` naming the file, the line (1-based, for Parquet the row
number) and the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
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


def _from_verl(obj: dict, where: str, row: int) -> dict:
    """A verl-schema row as a flat one (id, prompt, answer, messages, the rest)."""
    messages = obj["prompt"]
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: 'prompt' messages need a string 'role' and 'content', got {m!r:.80}")
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise DataError(f"{where}: 'prompt' has no user message")
    rm = obj.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise DataError(f"{where}: a chat-format row needs reward_model.ground_truth (the reference answer)")
    extra = obj.get("extra_info") if isinstance(obj.get("extra_info"), dict) else {}
    index = extra.get("index", obj.get("id", row))
    rest = {k: v for k, v in obj.items() if k not in ("prompt", "reward_model", "id")}
    return {**rest, "id": index, "prompt": users[-1], "answer": rm["ground_truth"], "messages": messages}


def _validate(obj: Any, where: str, row: int = 0) -> PromptRow:
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), list):
        obj = _from_verl(obj, where, row)
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


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line; invalid JSON is a ``DataError`` naming
    the file and line."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def _read_jsonl(path: Path) -> list[PromptRow]:
    rows: list[PromptRow] = []
    for lineno, obj in iter_jsonl(path):
        rows.append(_validate(obj, f"{path}:{lineno}", len(rows)))
    return rows


def _read_parquet(path: Path) -> list[PromptRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    return _rows_of_table(table, path)


def _read_saved_dataset(folder: Path) -> list[PromptRow]:
    """A folder written by ``datasets``' ``save_to_disk``: its Arrow files (IPC streams) in the order
    ``state.json`` lists them. Read with pyarrow alone (no ``datasets`` needed)."""
    import pyarrow as pa

    try:
        files = [f["filename"] for f in json.loads((folder / "state.json").read_text())["_data_files"]]
        tables = [pa.ipc.open_stream(pa.memory_map(str(folder / f))).read_all() for f in files]
    except Exception as e:
        raise DataError(f"{folder}: not a readable save_to_disk folder ({type(e).__name__}: {e})") from None
    if not tables:
        raise DataError(f"{folder}: the file has no rows")
    return _rows_of_table(pa.concat_tables(tables), folder)


def _rows_of_table(table, path: Path) -> list[PromptRow]:
    chat = "prompt" in table.column_names and "reward_model" in table.column_names
    missing = [] if chat else [k for k in REQUIRED if k not in table.column_names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing}; every row needs {list(REQUIRED)}, "
            "or verl's prompt (chat messages) and reward_model.ground_truth"
        )
    return [_validate(obj, f"{path}:row {i + 1}", i) for i, obj in enumerate(table.to_pylist())]


def load_rows(path: str | Path) -> list[PromptRow]:
    """Read and validate all rows; duplicate ids are an error (ids key the scheduler state). ``path``: a
    JSONL or Parquet file, a ``save_to_disk`` folder, or ``hf://datasets/ORG/NAME/FILE`` (resolved
    through the Hugging Face cache)."""
    if str(path).startswith("hf://"):
        from pc_megatron.hub import resolve_hf_file

        path = resolve_hf_file(str(path))
    path = Path(path)
    if path.is_dir() and (path / "state.json").is_file():
        rows = _read_saved_dataset(path)
    elif not path.is_file():
        raise DataError(f"{path}: dataset file not found; set data.train_path / data.eval_path to an existing file")
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = _read_jsonl(path)
    elif path.suffix.lower() == ".parquet":
        rows = _read_parquet(path)
    else:
        raise DataError(
            f"{path}: unsupported extension '{path.suffix.lower()}'; use .jsonl, .parquet or a save_to_disk folder"
        )
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
