"""SFT warm-start: cross-entropy on (prompt, answer) pairs with the same Megatron learner that
RL uses, exported as an HF folder and cached by everything that determines it."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from pc_megatron.batch import sft_batch
from pc_megatron.checkpoint.store import export_hf
from pc_megatron.data.config import DataConfig
from pc_megatron.data.dataset import PromptRow
from pc_megatron.data.sampler import PromptSampler
from pc_megatron.data.task import config_hash
from pc_megatron.embedded.task import split_fields
from pc_megatron.errors import ConfigError
from pc_megatron.files import atomic_write_text, one_at_a_time
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.model.config import ModelConfig
from pc_megatron.model.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from pc_megatron.config import WarmStartConfig

WARMSTART_FORMAT = 1  # bump when the SFT procedure changes, to invalidate caches
SHIPPED = Path(__file__).resolve().parent / "embedded" / "warmstart"


def warm_start_key(model: ModelConfig, warmstart: WarmStartConfig, data: DataConfig, micro_batch_size: int) -> str:
    """Hash of everything that determines the warm-start (portable: no machine paths)."""
    base = model.path or model.fixture or model.tiny
    ws = {k: v for k, v in asdict(warmstart).items() if k != "cache_dir"}
    if data.generator:  # the generated SFT rows, rendered with the recipe's template and instruction
        rows = [data.generator, data.word_problems, data.chat_template, data.instruction]
        return config_hash(WARMSTART_FORMAT, base, ws, *rows, micro_batch_size)
    syn = split_fields(data.synthetic)  # the RL pool does not change the SFT rows
    return config_hash(WARMSTART_FORMAT, base, ws, syn, micro_batch_size)


def warm_start_dir(key: str, cache: Path) -> Path:
    """Where the warm-start of ``key`` lives: shipped with the package (``SHIPPED``) when one
    matches, else in the cache (computed once)."""
    if (SHIPPED / key / "model.safetensors").is_file():
        return SHIPPED / key
    return cache / "warmstart" / key


def ensure_warm_start(
    out: Path, warmstart: WarmStartConfig, learner: LearnerConfig, base: Path, sft: list[PromptRow], progress: bool
) -> Path:
    """The warm-start's HF folder ``out`` (``warm_start_dir``), trained once from the HF folder
    ``base`` on the ``sft`` rows with ``warmstart``'s steps, batch and learning rate."""
    if (out / "model.safetensors").is_file():
        return out
    if not sft:
        raise ConfigError("warmstart.enabled needs SFT rows: set warmstart.data_path or disable the warm-start")
    # two runs starting at once compute it once: the second waits, then finds it (it would otherwise
    # replace the folder under the first run's feet)
    with one_at_a_time(out.with_name(f"{out.name}.lock"), f"the warm-start {out.name}"):
        if (out / "model.safetensors").is_file():
            return out
        return _train_warm_start(out, warmstart, learner, base, sft, progress)


def _train_warm_start(
    out: Path, warmstart: WarmStartConfig, learner: LearnerConfig, base: Path, sft: list[PromptRow], progress: bool
) -> Path:
    from pc_megatron.learner.learner import Learner

    ws = warmstart
    # the SFT warm-start runs in this process at TP=PP=DP=1 (the model is the embedded one or
    # small enough to fine-tune on one device; large models start RL from model.path as is), in fp32
    # whatever the RL learner's precision: one cached warm-start (its key has no dtype) serves both
    learner_cfg = replace(
        learner,
        bf16=False,
        fp8="",
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
    policy = Learner(base, learner_cfg, seed=0)
    tokenizer = load_tokenizer(base)
    sampler = PromptSampler(len(sft), seed=0)
    t0, losses = time.time(), []
    bar = tqdm(range(ws.steps), desc="warm-start (SFT)", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        rows = [sft[i] for i in sampler.next_batch(ws.batch_size)]
        losses.append(policy.train_sft(sft_batch(tokenizer, rows))["loss"])
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    export_hf(policy.hf_named_tensors(), base, out)
    info = {
        "key": out.name,
        "steps": ws.steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "wall_s": time.time() - t0,
        "reproduce": "pc-megatron warmstart RECIPE [key=value ...] (same config => same key)",
    }
    atomic_write_text(out / "warmstart.json", json.dumps(info, indent=2))
    return out
