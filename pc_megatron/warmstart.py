"""SFT warm-start: cross-entropy on (prompt, answer) pairs with the same Megatron learner that
RL uses, exported as an HF folder and cached by everything that determines it."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from tqdm import tqdm

from pc_megatron.batch import sft_batch
from pc_megatron.checkpoint import export_hf
from pc_megatron.data.sampler import PromptSampler
from pc_megatron.data.synthetic import split_fields
from pc_megatron.data.task import Task, cache_root, config_hash
from pc_megatron.errors import ConfigError
from pc_megatron.learner import Learner
from pc_megatron.model.resolve import base_model_dir
from pc_megatron.model.tiny import load_tokenizer

WARMSTART_FORMAT = 1  # bump when the SFT procedure changes, to invalidate caches
SHIPPED = Path(__file__).resolve().parent / "assets" / "warmstart"


def warm_start_key(cfg: Any) -> str:
    """Hash of everything that determines the warm-start (portable: no machine paths)."""
    model = cfg.model.path or cfg.model.fixture or cfg.model.tiny
    ws = {k: v for k, v in OmegaConf.to_container(cfg.warmstart).items() if k != "cache_dir"}
    if cfg.data.generator:  # the generated SFT rows, rendered with the recipe's template and instruction
        data = [cfg.data.generator, cfg.data.word_problems, cfg.data.chat_template, cfg.data.instruction]
        return config_hash(WARMSTART_FORMAT, model, ws, *data, cfg.learner.micro_batch_size)
    syn = split_fields(OmegaConf.to_object(cfg.data.synthetic))  # the RL pool does not change the SFT rows
    return config_hash(WARMSTART_FORMAT, model, ws, syn, cfg.learner.micro_batch_size)


def initial_policy_dir(cfg: Any) -> Path:
    """The HF folder RL starts from: the base model, or its warm-start — shipped with the
    package (``SHIPPED``) when one matches the config, else computed once into the cache."""
    if not cfg.warmstart.enabled:
        return base_model_dir(cfg)
    key = warm_start_key(cfg)
    if (SHIPPED / key / "model.safetensors").is_file():
        return SHIPPED / key
    return cache_root(cfg.warmstart.cache_dir) / "warmstart" / key


def ensure_warm_start(cfg: Any, task: Task, base: Path | None = None, progress: bool = True) -> Path:
    """The warm-start's HF folder, trained once from ``base`` (default: ``base_model_dir``)."""
    out = initial_policy_dir(cfg)
    if (out / "model.safetensors").is_file() or not cfg.warmstart.enabled:
        return out
    if not task.sft:
        raise ConfigError("warmstart.enabled needs SFT rows: set warmstart.data_path or disable the warm-start")
    base = base or base_model_dir(cfg)
    ws = cfg.warmstart
    # the SFT warm-start runs in this process at TP=PP=DP=1 (the model is the embedded one or
    # small enough to fine-tune on one device; large models start RL from model.path as is)
    learner_cfg = replace(
        OmegaConf.to_object(cfg.learner),
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_parallel_size=1,
        distributed_optimizer=False,
        lr=ws.lr,
        min_lr=ws.lr * 0.1,
        lr_warmup_steps=min(20, ws.steps // 10),
        lr_decay_style="cosine",
        lr_decay_steps=ws.steps,
    )
    learner = Learner(base, learner_cfg, seed=0)
    tokenizer = load_tokenizer(base)
    sampler = PromptSampler(len(task.sft), seed=0)
    t0, losses = time.time(), []
    bar = tqdm(range(ws.steps), desc="warm-start (SFT)", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        rows = [task.sft[i] for i in sampler.next_batch(ws.batch_size)]
        losses.append(learner.train_sft(sft_batch(tokenizer, rows))["loss"])
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    export_hf(learner.hf_named_tensors(), base, out)
    info = {
        "key": out.name,
        "steps": ws.steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "wall_s": time.time() - t0,
        "reproduce": "pc-megatron warmstart RECIPE [key=value ...] (same config => same key)",
    }
    (out / "warmstart.json").write_text(json.dumps(info, indent=2))
    return out
