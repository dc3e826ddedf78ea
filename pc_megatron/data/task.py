"""Resolve a config's datasets: user files, or the embedded synthetic task cached as JSONL."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from pc_megatron.data.config import DataConfig
from pc_megatron.data.dataset import PromptRow, load_rows, write_jsonl
from pc_megatron.embedded.task import expected_eval_rows, generate_splits, split_fields


@dataclass
class Task:
    train: list[PromptRow]
    eval: list[PromptRow]
    sft: list[PromptRow]
    sets: list[tuple[str, list[PromptRow], Any]] = field(default_factory=list)
    """``eval.sets`` as ``(name, rows, EvalSetConfig)``, once ``prepare_prompts`` has read them."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Prompts each split lost to ``data.max_prompt_tokens`` (``prepare_prompts``)."""


def cache_root(configured: str = "") -> Path:
    root = configured or os.environ.get("PC_MEGATRON_CACHE") or str(Path.home() / ".cache" / "pc-megatron")
    return Path(root)


def config_hash(*parts: Any) -> str:
    """A short, portable hash of config values (dataclasses hashed as their fields): cache keys."""
    blob = json.dumps([asdict(p) if is_dataclass(p) else p for p in parts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prepare_task(data: DataConfig, sft_path: str | None, cache: Path) -> Task:
    """Load (and for generated and synthetic tasks, first generate and cache under ``cache``) train /
    eval / SFT rows. ``sft_path``: the warm-start's SFT rows ('' = the generator's own worked
    examples; None = no warm-start, no SFT rows)."""
    sft = load_rows(sft_path) if sft_path else []
    if data.train_path:
        train = load_rows(data.train_path)
        held_out = load_rows(data.eval_path) if data.eval_path else []  # else eval.sets only
        return Task(train, held_out, sft)
    tasks = cache / "tasks"
    if data.generator:
        from pc_megatron.data.word_problems import generate_word_problems

        wp = data.word_problems
        folder = _cached_splits(tasks / f"word_problems-{config_hash(wp)}", lambda: generate_word_problems(wp))
        held_out = load_rows(data.eval_path) if data.eval_path else load_rows(folder / "eval.jsonl")
    else:
        syn = data.synthetic
        folder = _cached_splits(tasks / config_hash(split_fields(syn)), lambda: generate_splits(syn))
        held_out = load_rows(folder / "eval.jsonl")
    if sft_path == "":
        sft = load_rows(folder / "sft.jsonl")  # worked examples of the same generator
    return Task(load_rows(folder / "train.jsonl"), held_out, sft)


def _cached_splits(folder: Path, make: Callable[[], dict[str, list[PromptRow]]]) -> Path:
    """``folder`` holding ``train``/``eval``/``sft.jsonl``, written by ``make`` the first time."""
    if not all((folder / f"{s}.jsonl").is_file() for s in ("train", "eval", "sft")):
        for split, rows in make().items():
            write_jsonl(rows, folder / f"{split}.jsonl")
    return folder


def expected_eval_set(data: DataConfig, expected: bool, task: Task) -> list[PromptRow]:
    """The held-out set of ``eval.expected`` for the embedded task: the held-out split and
    ``num_eval_expected`` more prompts drawn after the RL pool is chosen, disjoint from every
    split and the pool. Small families (one-digit sums and products have 100 prompts each) are
    used up by the SFT split, so the extra prompts come from the large families only: the
    metric weights family means by the mix (``expected_accuracy(weights=...)``). Empty for user
    datasets or when switched off (``expected``: ``eval.expected``)."""
    syn = data.synthetic
    if data.train_path or not expected or not syn.num_eval_expected:
        return []
    taken = {r.prompt for split in (task.train, task.eval, task.sft) for r in split}
    if not task.sft:  # without the warm-start the SFT split is not loaded: exclude it all the same
        taken |= {r.prompt for r in generate_splits(syn)["sft"]}
    return task.eval + expected_eval_rows(syn, taken)


def prepare_prompts(data: DataConfig, eval_sets: list, task: Task, tokenizer) -> Task:
    """The task with its prompts rendered for ``tokenizer`` (chat template, instruction, length
    limit: ``data/render.py``), ``eval.sets`` read and rendered into ``sets``, and how many
    prompts each lost to ``data.max_prompt_tokens`` in ``dropped``."""
    from pc_megatron.data.render import render_rows

    train, lost_train = render_rows(task.train, tokenizer, data, data.train_path or "the training prompts")
    held_out, lost_eval = (
        render_rows(task.eval, tokenizer, data, data.eval_path or "the held-out prompts") if task.eval else ([], 0)
    )
    dropped = {"data/dropped_long_prompts": lost_train, "data/dropped_long_eval": lost_eval}
    sets = []
    for s in eval_sets:  # EvalSetConfig
        name = s.set_name
        rows, lost = render_rows(load_rows(s.path), tokenizer, data, s.path)
        sets.append((name, rows, s))
        dropped[f"data/dropped_long_eval/{name}"] = lost
    return Task(train, held_out, task.sft, sets, dropped)
