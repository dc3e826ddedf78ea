"""A run's task and starting policy, prepared in one step before anything starts.

Two paths, chosen by the config:

- **real data** (``data.train_path`` or ``data.generator``): the rows (files, or generated and
  cached), the starting policy from ``model.path`` or ``model.fixture`` (converted once into the
  cache), and an SFT warm-start only when ``warmstart.enabled`` asks for one (its rows rendered like
  the prompts: chat template, instruction). The embedded task's pool selection is never entered.
- **the embedded task** (neither): ``pc_megatron/embedded/``: the synthetic rows, the shipped or
  cached SFT warm-start of the tiny policy, the RL pool (``data.synthetic.pool``).

Either way the prompts are then rendered for the policy's tokenizer (chat template, instruction,
length limit). This module composes the run config's sections; what it calls takes only the
sections it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pc_megatron.data.task import Task, cache_root, config_hash, prepare_prompts, prepare_task
from pc_megatron.model.arch import load_arch
from pc_megatron.model.config import ModelConfig
from pc_megatron.model.tokenizer import load_tokenizer
from pc_megatron.warmstart import ensure_warm_start, warm_start_dir, warm_start_key

if TYPE_CHECKING:
    from pc_megatron.config import RunConfig


@dataclass
class Prepared:
    task: Task
    policy_dir: Path
    tokenizer: Any


def base_model_dir(model: ModelConfig, cache: Path, progress: bool = True) -> Path:
    """model.path, model.fixture (converted on first use into ``cache``), or the embedded tiny model
    (created and cached on first use)."""
    if model.path:
        from pc_megatron.hub import resolve_model_path

        folder = resolve_model_path(model.path)  # a folder, or a Hub id through the HF cache
        load_arch(folder)  # fails early, naming the file, if this is not a usable HF folder
        return folder
    if model.fixture:
        from pc_megatron.model.fixtures import fixture_dir

        return fixture_dir(model.fixture, cache, progress)
    base = cache / "init" / config_hash(model.tiny)
    if not (base / "model.safetensors").is_file():
        from pc_megatron.embedded.tiny_model import create_tiny_model  # the embedded task's only

        create_tiny_model(model.tiny, base)
    return base


def cache_dir(cfg: RunConfig) -> Path:
    """Where tasks, the tiny model, fixtures, warm-starts and pools are cached."""
    return cache_root(cfg.warmstart.cache_dir)


def load_task(cfg: RunConfig) -> Task:
    """The run's rows before rendering: train, held-out and (with a warm-start) SFT."""
    sft_path = cfg.warmstart.data_path if cfg.warmstart.enabled else None
    return prepare_task(cfg.data, sft_path, cache_dir(cfg))


def policy_key(cfg: RunConfig) -> str:
    """The warm-start's cache key (everything that determines it)."""
    return warm_start_key(cfg.model, cfg.warmstart, cfg.data, cfg.learner.micro_batch_size)


def initial_policy_dir(cfg: RunConfig) -> Path:
    """The HF folder RL starts from: the base model, or its warm-start (shipped with the package
    when one matches the config, else computed once into the cache)."""
    if not cfg.warmstart.enabled:
        return base_model_dir(cfg.model, cache_dir(cfg), cfg.progress)
    return warm_start_dir(policy_key(cfg), cache_dir(cfg))


def warm_started(cfg: RunConfig, sft: list, progress: bool = True) -> Path:
    """``initial_policy_dir``, trained first from the base model on the ``sft`` rows when it is a
    warm-start not yet in the cache."""
    out = initial_policy_dir(cfg)
    if not cfg.warmstart.enabled or (out / "model.safetensors").is_file():
        return out
    base = base_model_dir(cfg.model, cache_dir(cfg), cfg.progress)
    return ensure_warm_start(out, cfg.warmstart, cfg.learner, base, sft, progress)


def rl_pool(cfg: RunConfig, task: Task, policy_dir: Path, progress: bool = True) -> Task:
    """The embedded task with its train split replaced by the RL pool ``data.synthetic.pool`` chosen
    under the policy at ``policy_dir`` (``pc_megatron/embedded/pools.py``)."""
    from pc_megatron.embedded.pools import select_pool

    n = cfg.algo.samples_per_prompt
    temperature, key, cache = cfg.rollout.temperature, policy_key(cfg), cache_dir(cfg)
    return select_pool(cfg.data.synthetic, task, policy_dir, key, temperature, cache, n, progress)


def prepare_run(cfg: RunConfig, progress: bool = True) -> Prepared:
    task = load_task(cfg)
    if cfg.data.embedded:
        policy_dir = warm_started(cfg, task.sft, progress)
        task = rl_pool(cfg, task, policy_dir, progress)
    elif cfg.warmstart.enabled:
        from pc_megatron.data.render import render_rows

        base = base_model_dir(cfg.model, cache_dir(cfg), cfg.progress)
        sft, _ = render_rows(task.sft, load_tokenizer(base), cfg.data, cfg.warmstart.data_path or "the SFT rows")
        policy_dir = warm_started(cfg, sft, progress)
    else:
        policy_dir = base_model_dir(cfg.model, cache_dir(cfg), cfg.progress)
    tokenizer = load_tokenizer(policy_dir)
    return Prepared(prepare_prompts(cfg.data, cfg.eval.sets, task, tokenizer), policy_dir, tokenizer)
