"""A run's task and starting policy, prepared in one step before anything starts.

Two paths, chosen by the config:

- **real data** (``data.train_path`` or ``data.generator``): the rows (files, or generated and
  cached), the starting policy from ``model.path`` or ``model.fixture`` (converted once into the
  cache), and an SFT warm-start only when ``warmstart.enabled`` asks for one (its rows rendered like
  the prompts: chat template, instruction). The embedded task's pool selection is never entered.
- **the embedded task** (neither): ``pc_megatron/embedded.py``: the synthetic rows, the shipped or
  cached SFT warm-start of the tiny policy, the RL pool (``data.synthetic.pool``).

Either way the prompts are then rendered for the policy's tokenizer (chat template, instruction,
length limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pc_megatron.data.task import Task, embedded, prepare_prompts, prepare_task
from pc_megatron.model.resolve import base_model_dir
from pc_megatron.model.tiny import load_tokenizer


@dataclass
class Prepared:
    task: Task
    policy_dir: Path
    tokenizer: Any


def prepare_run(cfg: Any, progress: bool = True) -> Prepared:
    task = prepare_task(cfg)
    if embedded(cfg):
        from pc_megatron.embedded import prepare_embedded

        task, policy_dir = prepare_embedded(cfg, task, progress)
    elif cfg.warmstart.enabled:
        import dataclasses

        from pc_megatron.data.render import render_rows
        from pc_megatron.warmstart import ensure_warm_start

        base = base_model_dir(cfg)
        sft, _ = render_rows(task.sft, load_tokenizer(base), cfg.data, cfg.warmstart.data_path or "the SFT rows")
        policy_dir = ensure_warm_start(cfg, dataclasses.replace(task, sft=sft), base=base, progress=progress)
    else:
        policy_dir = base_model_dir(cfg)
    tokenizer = load_tokenizer(policy_dir)
    return Prepared(prepare_prompts(cfg, task, tokenizer), policy_dir, tokenizer)
