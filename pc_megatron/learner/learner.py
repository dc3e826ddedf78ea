"""The learner: one Megatron-Core model and optimizer serving SFT (cross-entropy) and RL.

Batches arrive as right-padded token matrices. Position ``t`` of every per-token tensor
refers to predicting ``tokens[:, t + 1]`` from ``tokens[:, : t + 1]``, hence the ``S - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.grpo_loss import logprob_entropy
from pc_megatron.algo.loss import LossConfig, policy_loss, token_mean
from pc_megatron.errors import ModelFileError, TrainingError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.model import build_gpt_model
from pc_megatron.learner.parallel import init_parallel
from pc_megatron.model.arch import ArchSpec, load_arch
from pc_megatron.weight_sync.mapping import megatron_to_hf
from pc_megatron.weight_sync.sharding import HFTensors, check_divisible, megatron_shard_from_hf, split_kind, unshard


@dataclass
class TokenBatch:
    """``tokens: (N, S) int64`` right-padded; ``loss_mask: (N, S-1) float32`` (1 = trained)."""

    tokens: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def rows(self, idx: slice | torch.Tensor) -> TokenBatch:
        return TokenBatch(self.tokens[idx], self.loss_mask[idx])


def load_hf_weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF folder, whole (the learner itself reads only its shards)."""
    hf = HFTensors(model_dir)
    return {key: hf.read(key) for key in hf.where}


class Learner:
    def __init__(self, model_dir: str | Path, cfg: LearnerConfig, seed: int) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        from pc_megatron.compat import megatron_cpu

        cfg.validate()
        self.cfg = cfg
        self.parallel = init_parallel(cfg.tensor_parallel_size, cfg.pipeline_parallel_size)
        self.arch: ArchSpec = load_arch(model_dir)
        megatron_cpu.seed_model_parallel(seed)
        check_divisible(self.arch, cfg.tensor_parallel_size)
        module = build_gpt_model(
            self.arch, cfg.transformer_impl, cfg.bf16, cfg.fp8, cfg.fp8_recipe, cfg.sequence_parallel
        )
        self.device = next(module.parameters()).device
        self._load_hf(module, model_dir)
        self.model = DistributedDataParallel(
            module.config,
            DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False),
            module,
        )
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=cfg.lr,
                min_lr=cfg.min_lr,
                weight_decay=cfg.weight_decay,
                adam_beta1=cfg.adam_beta1,
                adam_beta2=cfg.adam_beta2,
                adam_eps=cfg.adam_eps,
                clip_grad=cfg.clip_grad,
                bf16=cfg.bf16,
                params_dtype=torch.bfloat16 if cfg.bf16 else torch.float32,
            ),
            [self.model],
        )
        self.scheduler = OptimizerParamScheduler(
            self.optimizer,
            init_lr=0.0 if cfg.lr_warmup_steps else cfg.lr,
            max_lr=cfg.lr,
            min_lr=cfg.min_lr,
            lr_warmup_steps=cfg.lr_warmup_steps,
            lr_decay_steps=max(cfg.lr_decay_steps, cfg.lr_warmup_steps + 1),
            lr_decay_style=cfg.lr_decay_style,
            start_wd=cfg.weight_decay,
            end_wd=cfg.weight_decay,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )
        self.version = 0  # policy version: number of optimizer steps taken
        self._masks: dict[int, torch.Tensor] = {}

    # ----------------------------------------------------------------- weights
    @property
    def module(self) -> torch.nn.Module:
        return self.model.module

    def _load_hf(self, module: torch.nn.Module, model_dir: str | Path) -> None:
        """Each parameter's tensor-parallel shard, read from the HF safetensors (slices only)."""
        hf = HFTensors(model_dir)
        rank, size = self._tp_rank_size()
        with torch.no_grad():
            for name, param in module.named_parameters():
                try:
                    tensor = megatron_shard_from_hf(name, hf, self.arch, rank, size)
                except KeyError as e:
                    raise ModelFileError(f"{model_dir}: {e.args[0]}; the weights do not match config.json") from None
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ModelFileError(
                        f"{model_dir}: {name} has shape {tuple(tensor.shape)} (TP shard {rank}/{size}), the "
                        f"model built from config.json expects {tuple(param.shape)}; the weights are from a "
                        "different model"
                    )
                param.copy_(tensor)

    def _tp_rank_size(self) -> tuple[int, int]:
        from megatron.core import parallel_state as ps

        return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()

    def full_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Megatron names with full (TP=1) tensors: shards gathered over the tensor-parallel
        group one parameter at a time, so at most one full tensor is held at once."""
        from megatron.core import parallel_state as ps

        _, size = self._tp_rank_size()
        for name, p in self.module.named_parameters():
            local = p.detach()
            if size == 1 or split_kind(name) == "replicated":
                yield name, local
                continue
            shards = [torch.empty_like(local) for _ in range(size)]
            torch.distributed.all_gather(shards, local.contiguous(), group=ps.get_tensor_model_parallel_group())
            yield name, unshard(name, shards)

    def hf_named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Current weights under HF names and layouts (for weight sync and export). Tensors may be
        views of the parameters: copy them to keep them across an optimizer step."""
        for name, full in self.full_named_parameters():
            yield from megatron_to_hf({name: full}, self.arch)

    # ----------------------------------------------------------------- forward
    def _causal_mask(self, s: int) -> torch.Tensor:
        if s not in self._masks:
            self._masks[s] = torch.triu(torch.ones(s, s, dtype=torch.bool, device=self.device), 1)[None, None]
        return self._masks[s]

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape
        pos = torch.arange(s, device=self.device).unsqueeze(0).expand(b, -1)
        return self.model(tokens, pos, self._causal_mask(s))

    def _token_logp(self, logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
        """``(log p(tokens[:, t+1]), entropy)`` each ``(N, S-1)`` at the sampling temperature,
        through kernels.grpo_loss (fused Triton kernel or its torch reference)."""
        n, s, v = logits.shape
        # Score every position (a dummy target for the last) so the logits are never copied.
        targets = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        logp, entropy = logprob_entropy(logits.reshape(-1, v), targets.reshape(-1), temperature, self.cfg.loss_impl)
        return logp.view(n, s)[:, :-1], entropy.view(n, s)[:, :-1]

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """``(N, S-1) float32`` log-probs of each next token under the current policy."""
        self.model.eval()
        out = []
        for start in range(0, len(batch), self.cfg.micro_batch_size):
            mb = batch.rows(slice(start, start + self.cfg.micro_batch_size))
            logp, _ = self._token_logp(self._logits(mb.tokens.to(self.device)), mb.tokens.to(self.device), temperature)
            out.append(logp.cpu())
        return torch.cat(out)

    # ----------------------------------------------------------------- updates
    def _step(self, micro_losses: Iterator[torch.Tensor]) -> dict[str, float]:
        """Accumulate gradients over micro-batches, then one optimizer step."""
        from megatron.core.distributed import finalize_model_grads

        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        total = 0.0
        for loss in micro_losses:
            if not torch.isfinite(loss):
                raise TrainingError(
                    f"non-finite loss ({loss.item()}) at policy version {self.version}; nothing was applied "
                    "and the last checkpoint is intact: lower the learning rate or check the rewards"
                )
            loss.backward()
            total += loss.item()
        # data-parallel sync, plus what TP needs: Qwen3's q/k norm grads are partial per rank
        finalize_model_grads([self.model])
        _, grad_norm, _ = self.optimizer.step()
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise TrainingError(f"non-finite gradient norm at policy version {self.version}; lower the learning rate")
        self.scheduler.step(1)
        self.version += 1
        return {"loss": total, "grad_norm": float(grad_norm or 0.0), "lr": self.optimizer.param_groups[0]["lr"]}

    def train_sft(self, batch: TokenBatch) -> dict[str, float]:
        """One optimizer step of token-mean cross-entropy on the masked tokens."""
        n_tok = float(batch.loss_mask.sum())

        def losses():
            for start in range(0, len(batch), self.cfg.micro_batch_size):
                mb = batch.rows(slice(start, start + self.cfg.micro_batch_size))
                tokens = mb.tokens.to(self.device)
                logp, _ = self._token_logp(self._logits(tokens), tokens, 1.0)
                yield token_mean(-logp, mb.loss_mask.to(self.device), n_tok)

        return self._step(losses())

    def train_rl(
        self,
        batch: TokenBatch,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        loss_cfg: LossConfig,
        temperature: float,
        ref_logp: torch.Tensor | None = None,
        is_weight: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One optimizer step of the clipped surrogate over ``batch`` (token-mean over all of it).

        ``old_logp: (N, S-1)``, ``advantages: (N,)`` broadcast over each sequence's tokens.
        ``is_weight: (N, S-1)``, optional, scales each token's policy-gradient term (truncated
        importance sampling; the weights are constants, so this scales the advantage).
        """
        mask_all = batch.loss_mask
        n_tok = float(mask_all.sum())
        sums = {"clipfrac": 0.0, "entropy": 0.0, "kl": 0.0}

        def losses():
            for start in range(0, len(batch), self.cfg.micro_batch_size):
                sl = slice(start, start + self.cfg.micro_batch_size)
                tokens = batch.tokens[sl].to(self.device)
                mask = mask_all[sl].to(self.device)
                logp, entropy = self._token_logp(self._logits(tokens), tokens, temperature)
                ref = ref_logp[sl].to(self.device) if ref_logp is not None else None
                adv = advantages[sl, None].to(self.device)
                if is_weight is not None:
                    adv = adv * is_weight[sl].to(self.device)
                loss, stats = policy_loss(logp, old_logp[sl].to(self.device), adv, loss_cfg, ref, entropy)
                sums["clipfrac"] += float((stats["clipped"] * mask).sum())
                sums["entropy"] += float((entropy.detach() * mask).sum())
                if "kl" in stats:
                    sums["kl"] += float((stats["kl"] * mask).sum())
                yield token_mean(loss, mask, n_tok)

        out = self._step(losses())
        out.update({k: v / max(n_tok, 1.0) for k, v in sums.items()})
        return out

    # ----------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        return {
            "model": {n: p.detach().clone() for n, p in self.module.named_parameters()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "tensor_parallel_size": self.parallel.tensor_parallel_size,
            "arch": self.arch.__dict__,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["arch"] != self.arch.__dict__:
            diff = {
                k: (v, self.arch.__dict__.get(k)) for k, v in state["arch"].items() if self.arch.__dict__.get(k) != v
            }
            raise ModelFileError(f"checkpoint is from a different model (checkpoint vs this run: {diff})")
        saved_tp = state.get("tensor_parallel_size", 1)
        if saved_tp != self.parallel.tensor_parallel_size:
            raise ModelFileError(
                f"checkpoint was saved at tensor_parallel_size={saved_tp}, this run uses "
                f"{self.parallel.tensor_parallel_size}; resume at the saved size (resharding is not supported yet)"
            )
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, t in state["model"].items():
                params[name].copy_(t)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = state["version"]
