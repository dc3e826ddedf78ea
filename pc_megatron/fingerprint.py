"""What a run trains on, as short hashes kept in every checkpoint and compared on ``--resume``: the
steps already taken are only continued by the same run. The config's keys a resume may not change are
checked against the run folder's ``config.yaml`` (``config.resume_changes``); these catch what that
file does not show: data files that changed on disk under the same names, a tokenizer that changed in
the model folder, a ``config.yaml`` edited by hand.
"""

from __future__ import annotations

import json
from typing import Any

from pc_megatron.config import RESUME_SAFE, RunConfig, leaf_values
from pc_megatron.data.task import Task, config_hash
from pc_megatron.errors import ConfigError

WHAT = {
    "config": "the config's keys a resume may not change",
    "train_data": "the training prompts and answers",
    "eval_data": "the held-out prompts and answers",
    "tokenizer": "the tokenizer (vocabulary, special tokens, chat template)",
}


def _rows(rows) -> list[tuple[str, str, str]]:
    return [(r.id, r.prompt, r.answer) for r in rows]


def tokenizer_digest(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    special = {k: str(v) for k, v in getattr(tokenizer, "special_tokens_map", {}).items()}
    return config_hash([type(tokenizer).__name__, vocab, special, getattr(tokenizer, "chat_template", None)])


def run_fingerprint(cfg: RunConfig, task: Task, tokenizer: Any) -> dict[str, Any]:
    """The config's fixed keys as they are (a key a later version adds is not a difference), the
    inputs as hashes."""
    fixed = {k: v for k, v in leaf_values(cfg).items() if not k.startswith(RESUME_SAFE)}
    held_out = [_rows(task.eval), *[(name, _rows(rows)) for name, rows, _ in task.sets]]
    return {
        "config": json.loads(json.dumps(fixed, default=str)),
        "train_data": f"{len(task.train)} rows, {config_hash(_rows(task.train))}",
        "eval_data": config_hash(held_out),
        "tokenizer": tokenizer_digest(tokenizer),
    }


def check_resume(saved: dict[str, Any] | None, now: dict[str, Any], checkpoint: str) -> None:
    """One ConfigError naming every part that differs from the checkpoint's (``saved`` None: a
    checkpoint written before fingerprints, not checked)."""
    if saved is None:
        return
    parts = []
    was, is_ = saved.get("config", {}), now["config"]
    keys = sorted(k for k in was.keys() & is_.keys() if was[k] != is_[k])
    if keys:
        shown = ", ".join(f"{k}: {was[k]!r} -> {is_[k]!r}" for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
        parts.append(f"{WHAT['config']} ({shown})")
    for k in ("train_data", "eval_data", "tokenizer"):
        if k in saved and saved[k] != now[k]:
            parts.append(f"{WHAT[k]} ({saved[k]} at the checkpoint, {now[k]} now)")
    if parts:
        raise ConfigError(
            f"--resume from {checkpoint}: this run would continue on other inputs than the steps already taken: "
            f"{'; '.join(parts)}. Put back what the run was started with (data files, model folder, config.yaml), "
            "or start a new run directory"
        )
