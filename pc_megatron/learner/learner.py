"""The learner: one Megatron-Core model and optimizer serving SFT (cross-entropy) and RL.

Batches arrive as right-padded token matrices. Position ``t`` of every per-token tensor
refers to predicting ``tokens[:, t + 1]`` from ``tokens[:, : t + 1]``, hence the ``S - 1``.

Every forward and backward goes through Megatron-Core's schedule (no pipelining at PP=1,
1F1B at PP>1): the loss function runs on the last pipeline stage and returns a loss sum and its
units (tokens, or sequences: ``algo.objective``); Megatron divides the gradients by the units
summed over micro-batches and data-parallel ranks, so the update is the same at any TP/PP/DP and
however the batch is cut. Every rank passes the same batch and plans the same micro-batches
(``microbatch.py``). Results (log-probs, statistics) are returned on every rank.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from kernels.grpo_loss import logprob_entropy
from pc_megatron.algo.config import LossConfig
from pc_megatron.algo.objective import check_inputs, rl_objective, stat_keys
from pc_megatron.batch import TokenBatch
from pc_megatron.errors import TrainingError
from pc_megatron.learner.checkpoint_io import load_state, save_state
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.export import LearnerWeights
from pc_megatron.learner.layout import MicroBatchInput
from pc_megatron.learner.microbatch import (
    MicroBatchPlan,
    alignment,
    plan_micro_batches,
    plan_shared_prefix,
    shared_prefix_units,
)
from pc_megatron.learner.model import build_gpt_model, build_training, resolve_transformer_impl
from pc_megatron.learner.offload import PinnedOffload
from pc_megatron.learner.parallel import init_parallel
from pc_megatron.model.arch import ArchSpec, load_arch
from pc_megatron.phases import phase_range
from pc_megatron.weight_sync.sharding import check_divisible


class Learner:
    """This rank's share of one policy: SFT and RL steps (``algo.objective``), log-probs; weights in
    and out through ``export.LearnerWeights``, checkpoints through ``checkpoint_io``."""

    def __init__(self, model_dir: str | Path, cfg: LearnerConfig, seed: int) -> None:
        from pc_megatron.compat import megatron_cpu

        cfg.validate()
        if cfg.bf16 == "auto":  # a run resolves it when it starts; a learner built on its own, here
            from pc_megatron.learner.precision import resolve_bf16

            cfg = dataclasses.replace(cfg, bf16=resolve_bf16("auto", torch.get_num_threads())[0])
        self.cfg = cfg
        self.parallel = init_parallel(cfg.tensor_parallel_size, cfg.pipeline_parallel_size, cfg.distributed_timeout_s)
        self.arch: ArchSpec = load_arch(model_dir)
        megatron_cpu.seed_model_parallel(seed)
        check_divisible(self.arch, cfg.tensor_parallel_size, cfg.pipeline_parallel_size)
        module = build_gpt_model(
            self.arch, self.parallel, cfg.transformer_impl, cfg.bf16, cfg.fp8, cfg.fp8_recipe, cfg.sequence_parallel
        )
        self.device = next(module.parameters()).device
        self.transformer_impl = resolve_transformer_impl(cfg.transformer_impl)
        self.weights = LearnerWeights(module, self.arch, self.transformer_impl, self.parallel)
        self.weights.check_names()
        self.weights.load_hf(model_dir)
        self.model, self.optimizer, self.lr_schedule = build_training(module, cfg)
        self.version = 0  # policy version: number of optimizer steps taken
        self._offloaded = False
        self._host = PinnedOffload()  # pinned host buffers for the optimizer state while offloaded
        self.align = alignment(cfg.tensor_parallel_size, cfg.sequence_parallel, bool(cfg.fp8), cfg.fp8_recipe)
        self._pass_stats: dict[str, dict[str, float]] = {}
        self._oversize_said = False
        self._picked: torch.Tensor | None = None  # the positions the output layer computes (_pick_hidden)
        self._rope_positions: torch.Tensor | None = None  # RoPE's positions of a shared-prompt stream
        if self.parallel.last_stage:
            module.output_layer.register_forward_pre_hook(self._pick_hidden, with_kwargs=True)
        if cfg.share_prompts:
            if self.transformer_impl != "local":
                from pc_megatron.errors import ConfigError

                raise ConfigError(
                    "learner.share_prompts runs on the local layer spec only (its attention reads the shared "
                    "prompt); Transformer Engine's packed attention cannot: set learner.share_prompts=false "
                    "or learner.transformer_impl=local"
                )
            module.rotary_pos_emb.register_forward_hook(self._rope_at_positions)

    # ----------------------------------------------------------------- weights
    @property
    def module(self) -> torch.nn.Module:
        return self.model.module

    def param_dtypes(self) -> dict[str, int]:
        """Parameters of this rank's model by dtype, read back from the model (``{"torch.bfloat16": 170, ...}``)."""
        counts: dict[str, int] = {}
        for p in self.module.parameters():
            counts[str(p.dtype)] = counts.get(str(p.dtype), 0) + p.numel()
        return counts

    def full_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Global Megatron names with full (TP=1) tensors, on every rank (``export.LearnerWeights``)."""
        return self.weights.full_named_parameters()

    def hf_named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Current weights under HF names, on every rank (``export.LearnerWeights``); views: copy to keep."""
        return self.weights.hf_named_tensors()

    # ----------------------------------------------------------------- colocation
    def offload(self) -> None:
        """Before the engine generates, on a GPU: the training peak's cached blocks go back to the
        driver (the engine's KV cache maps fresh memory when it wakes), and with
        ``offload_during_rollout`` the optimizer state (and fp32 main weights) moves to host memory
        and the gradient buffers are freed too."""
        if self.device.type != "cuda":
            return
        if self.cfg.offload_during_rollout and not self._offloaded:
            self.model.offload_grad_buffers()
            self._host.offload(self.optimizer, self.model.parameters())
            self._offloaded = True
        torch.cuda.empty_cache()

    def onload(self) -> None:
        """Undo ``offload``; the update, ``save`` and ``load`` call it first (gradient buffers
        come back zeroed)."""
        if self._offloaded:
            self._host.restore(self.optimizer)
            self.model.restore_grad_buffers()
            self._offloaded = False

    # ----------------------------------------------------------------- forward
    def _plan(self, batch: TokenBatch, max_tokens: int) -> tuple[MicroBatchPlan, list[int]]:
        """Every data-parallel rank's micro-batches for ``batch`` (the same plan on every rank); with
        ``learner.share_prompts``, rows with one prompt carry it once (``plan_shared_prefix``)."""
        lengths = batch.lengths()
        if self.cfg.share_prompts:
            plan = plan_shared_prefix(
                lengths,
                shared_prefix_units(batch.prompts()),
                self.parallel.data_parallel_size,
                max_tokens=max_tokens,
                align=self.align,
                attention_tokens=6.0 * self.arch.hidden_size,
            )
        else:
            plan = plan_micro_batches(
                lengths,
                self.parallel.data_parallel_size,
                max_tokens=max_tokens,
                rows_per_micro_batch=self.cfg.micro_batch_size,
                packed=self.cfg.packing,
                align=self.align,
                attention_tokens=6.0 * self.arch.hidden_size,
            )
        if plan.oversize and not self._oversize_said:
            self._oversize_said = True
            longest = max(lengths[i] for i in plan.oversize)
            print(
                f"learner: {len(plan.oversize)} row(s) longer than the micro-batch token budget ({max_tokens}) run "
                f"alone (longest {longest} tokens); raise the budget if memory allows (said once)",
                flush=True,
            )
        return plan, lengths

    def _scored(self, mb: MicroBatchInput, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scored, picked)``: which ``(b, columns)`` row positions get a log-prob (those the batch's
        ``(N, S-1)`` loss ``mask`` trains; every position of a row it trains none of), and their places
        in the micro-batch's flattened ``(b * width)`` model positions."""
        positions = torch.arange(mb.tokens.numel(), device=mb.tokens.device).view(mb.tokens.shape)
        where = mb.per_row(positions)
        scored = mask[mb.rows, : mb.columns] != 0
        scored |= ~scored.any(1, keepdim=True)  # a row with nothing trained: all of it (see TokenBatch.lengths)
        scored &= torch.arange(mb.columns)[None, :] < (mb.lengths - 1)[:, None]
        scored = scored.to(mb.tokens.device)
        return scored, where[scored]

    def _pick_hidden(self, module, args, kwargs):
        """Forward pre-hook of the output layer: only the hidden states of the picked positions reach
        it (``(s, b, h)`` -> ``(P, 1, h)``), as Megatron's own inference keeps only the last token's.
        The output layer is a fifth of a 135M model's matmul work and an RL row's prompt most of it."""
        if self._picked is None:
            return None
        hidden = args[0]
        flat = hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])  # (b * s, h), the logits' order
        return (flat[self._picked][:, None, :], *args[1:]), kwargs

    def _rope_at_positions(self, module, args, freqs):
        """Forward hook of RoPE: in a shared-prompt stream a row's answer continues from the prompt it
        shares, so each stream position gets its own position's frequencies (``(T, 1, 1, d)``, which
        Megatron's THD RoPE maps one to one: ``rope_utils._apply_rotary_pos_emb_thd``)."""
        if self._rope_positions is None:
            return None
        return freqs[self._rope_positions.to(freqs.device)]

    def _token_logp(
        self,
        logits: torch.Tensor,
        mb: MicroBatchInput,
        temperature: float,
        scored: torch.Tensor,
        picked: torch.Tensor,
        prepicked: bool,
    ):
        """``(log p(next token), entropy)`` each ``(b, columns)`` per row at the sampling temperature,
        through kernels.grpo_loss (fused Triton kernel or its torch reference), at the ``scored``
        positions (``_scored``), zero elsewhere. ``logits``: ``(1, P, V)``, a row per picked position
        (``prepicked``: ``_pick_hidden`` ran), or the model's whole ``(b, width, V)``."""
        v = logits.shape[-1]
        flat = logits.reshape(-1, v)
        if not prepicked:  # the whole micro-batch's logits: take the scored ones
            flat = flat[picked]
        targets = mb.row_targets().to(scored.device)[scored]
        logp_picked, entropy_picked = logprob_entropy(flat, targets, temperature, self.cfg.loss_impl)
        logp = torch.zeros(scored.shape, dtype=logp_picked.dtype, device=logits.device)
        entropy = torch.zeros(scored.shape, dtype=entropy_picked.dtype, device=logits.device)
        return logp.index_put((scored,), logp_picked), entropy.index_put((scored,), entropy_picked)

    def _run(
        self, batch: TokenBatch, loss_fn: Callable, keys: tuple[str, ...], kind: str, scoring: bool = True
    ) -> dict:
        """Run this rank's micro-batches of ``batch`` through Megatron's schedule (``kind``: 'train'
        with a backward pass, else forward only). ``loss_fn(mb, token_logp) -> (loss_sum, units,
        {key: sum})`` runs on the last stage, ``mb`` a ``MicroBatchInput``, ``token_logp(temperature)``
        its ``(log-probs, entropies)`` at the positions ``_scored`` picks (the output layer computes only
        those) or, with ``scoring`` False, ``loss_fn(mb, logits)`` with the whole logits. Megatron
        divides the gradients by the units summed over micro-batches and data-parallel ranks. The sums
        come back on every rank."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        budget = self.cfg.max_tokens_per_micro_batch
        if kind != "train":
            budget = self.cfg.logprob_max_tokens_per_micro_batch or budget
        plan, lengths = self._plan(batch, budget)
        self._count_pass(kind, plan.stats(lengths))
        mine = plan.ranks[self.parallel.data_parallel_rank]
        parts: list[torch.Tensor] = []  # per micro-batch sums, kept on the device (no sync per micro-batch)
        causal_mask = self.transformer_impl == "local"  # TE's causal attention takes no mask

        def forward_step(data_iterator, model):
            mb = MicroBatchInput(batch.tokens, lengths, next(data_iterator), self.device, causal_mask)
            scored, picked = self._scored(mb, batch.loss_mask) if scoring else (None, None)
            # the output layer sees only the scored positions (not under sequence parallelism, whose
            # output layer gathers the sequence itself, nor FP8, whose GEMMs want aligned row counts)
            prepick = scoring and not (self.cfg.sequence_parallel or self.cfg.fp8)

            def loss_func(logits):
                if scoring:
                    token_logp = functools.partial(
                        self._token_logp, logits, mb, scored=scored, picked=picked, prepicked=prepick
                    )
                    loss, count, extra = loss_fn(mb, token_logp)
                else:
                    loss, count, extra = loss_fn(mb, logits)
                values = [loss.detach(), count, *(extra[k] for k in keys)]
                parts.append(torch.stack([torch.as_tensor(v, device=self.device).double() for v in values]))
                return loss, torch.as_tensor(count).to(torch.int).to(self.device), {}

            self._picked = picked if prepick else None
            self._rope_positions = mb.position_ids[0] if mb.mb.prefix else None
            try:
                logits = model(mb.tokens, mb.position_ids, mb.attention_mask, packed_seq_params=mb.packed_seq_params)
            finally:
                self._picked = None
                self._rope_positions = None
            return logits, loss_func

        if mine:
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(mine),
                model=[self.model],
                num_microbatches=len(mine),
                seq_length=max(mb.width for mb in mine),  # shapes travel with each micro-batch (PP > 1)
                micro_batch_size=max(len(mb.rows) for mb in mine),
                forward_only=kind != "train",
            )
        if parts:
            sums = torch.stack(parts).sum(0)
        else:  # not the last stage, or no rows on this data-parallel rank
            sums = torch.zeros(len(keys) + 2, dtype=torch.float64, device=self.device)
        sums = self.parallel.collect(sums, self.device)
        return dict(zip(("loss", "units", *keys), sums.tolist(), strict=True))

    def _count_pass(self, kind: str, stats: dict[str, float]) -> None:
        mine = self._pass_stats.setdefault(kind, dict.fromkeys(stats, 0.0) | {"passes": 0.0})
        for key, value in stats.items():
            mine[key] += value
        mine["passes"] += 1

    def take_pass_stats(self) -> dict[str, dict[str, float]]:
        """What the passes since the last call processed, by kind ('train', 'logprob'): real tokens,
        processed positions (padding included), micro-batches on the busiest data-parallel rank,
        passes. Resets the counters."""
        out, self._pass_stats = self._pass_stats, {}
        return out

    def forward_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(N, S, V) float32`` logits of a token batch, on every rank (parity checks, tools;
        training never materialises more than one micro-batch of logits)."""
        batch = TokenBatch(tokens, torch.zeros(tokens.shape[0], tokens.shape[1] - 1))
        shape = (tokens.shape[1], self.arch.vocab_size)
        return self._per_row(batch, shape, lambda mb, logits: mb.per_row(logits, extra=1), scoring=False)

    def logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """``(N, S-1) float32`` log-probs of each next token under the current policy where the batch's
        loss mask trains it (every position of a row it trains none of, up to its length), 0 elsewhere:
        only those positions reach the output layer (``_scored``)."""
        width = (batch.tokens.shape[1] - 1,)
        return self._per_row(batch, width, lambda mb, token_logp: token_logp(temperature)[0])

    @torch.no_grad()
    def _per_row(
        self, batch: TokenBatch, shape: tuple[int, ...], value: Callable, scoring: bool = True
    ) -> torch.Tensor:
        """``(N, *shape) float32``: ``value(mb, token_logp or logits) -> (b, columns, ...)`` of every
        micro-batch (``_run``'s ``scoring``), forward only, gathered into one tensor on every rank (zeros
        past each row's columns)."""
        self.model.eval()
        out = torch.zeros(len(batch), *shape)

        def loss_fn(mb, logits):
            got = value(mb, logits).float().cpu()
            out[mb.rows, : got.shape[1]] = got
            return torch.zeros((), device=self.device), 0, {}

        self._run(batch, loss_fn, (), kind="logprob", scoring=scoring)
        return self.parallel.collect(out, self.device)

    # ----------------------------------------------------------------- updates
    def _step(self, batch: TokenBatch, loss_fn: Callable, keys: tuple[str, ...] = ()) -> dict[str, float]:
        """Gradients of ``loss_fn``'s sum over ``batch`` divided by its units summed over the whole
        batch (accumulated over micro-batches, reduced over data-parallel ranks), then one optimizer
        step. ``keys`` come back divided by the trained-token count (``tokens`` among them)."""
        self.onload()
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        if float(batch.loss_mask.sum()) < 1:
            raise TrainingError("the batch has no trained tokens (loss_mask is all zero); nothing to learn from")
        if len(batch) < self.parallel.data_parallel_size:
            raise TrainingError(
                f"a batch of {len(batch)} sequences cannot feed {self.parallel.data_parallel_size} data-parallel "
                "ranks; train on at least one sequence per rank (algo.prompts_per_step x samples_per_prompt)"
            )
        with phase_range("forward_backward"):
            sums = self._run(batch, loss_fn, ("tokens", *keys), kind="train")
        loss = sums["loss"] / max(sums["units"], 1.0)
        if not math.isfinite(loss):
            raise TrainingError(
                f"non-finite loss ({loss}) at policy version {self.version}; nothing was applied "
                "and the last checkpoint is intact: lower the learning rate or check the rewards"
            )
        t_opt = time.perf_counter()
        with phase_range("optimizer"):
            _, grad_norm, _ = self.optimizer.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # the step's kernels are asynchronous: time them, not their launch
        t_opt = time.perf_counter() - t_opt
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise TrainingError(f"non-finite gradient norm at policy version {self.version}; lower the learning rate")
        self.lr_schedule.step(1)
        self.version += 1
        out = {
            "loss": loss,
            "grad_norm": float(grad_norm or 0.0),
            "lr": self.optimizer.param_groups[0]["lr"],
            "time_optimizer_s": t_opt,
        }
        out.update({k: sums[k] / max(sums["tokens"], 1.0) for k in keys})
        return out

    def train_sft(self, batch: TokenBatch) -> dict[str, float]:
        """One optimizer step of token-mean cross-entropy on the masked tokens."""
        mask = batch.loss_mask.to(self.device)

        def loss_fn(mb, token_logp):
            logp, _ = token_logp(1.0)
            m = mask[mb.rows.to(self.device), : mb.columns]
            return (-logp * m).sum(), m.sum(), {"tokens": m.sum()}

        return self._step(batch, loss_fn)

    def train_rl(
        self,
        batch: TokenBatch,
        old_logp: torch.Tensor | None,
        advantages: torch.Tensor,
        loss_cfg: LossConfig,
        temperature: float,
        ref_logp: torch.Tensor | None = None,
        behaviour_logp: torch.Tensor | None = None,
        units_scale: float = 1.0,
    ) -> dict:
        """One optimizer step of ``algo.objective.rl_objective`` over ``batch`` (aggregated by
        ``loss_cfg.agg`` over all of it); statistics are token means over the batch.

        ``advantages: (N,)``; ``old_logp``, ``ref_logp``, ``behaviour_logp``: ``(N, S-1)`` or None.
        ``old_logp=None``: with one optimizer step per batch the old policy is the current one, so
        the update's own forward gives them (detached: the ratio is 1, its gradient that of log pi)
        and they come back as ``out["old_logp"]`` (saves a forward pass). ``units_scale``: see
        ``rl_objective`` (rows of zero loss left out by the caller)."""
        check_inputs(loss_cfg, behaviour_logp is not None)
        own = torch.zeros(batch.loss_mask.shape) if old_logp is None else None

        def loss_fn(mb, token_logp):
            rows, k = mb.rows, mb.columns

            def cut(t: torch.Tensor | None) -> torch.Tensor | None:
                return None if t is None else t[rows, :k].to(self.device)

            logp, entropy = token_logp(temperature)
            if own is not None:
                own[rows, :k] = logp.detach().float().cpu()
            old = logp.detach() if own is not None else cut(old_logp)
            given = {"behaviour_logp": cut(behaviour_logp), "ref_logp": cut(ref_logp), "units_scale": units_scale}
            adv = advantages[rows].to(self.device)
            return rl_objective(logp, entropy, old, adv, cut(batch.loss_mask), loss_cfg, **given)

        out: dict = self._step(batch, loss_fn, stat_keys(loss_cfg))
        if own is not None:
            out["old_logp"] = self.parallel.collect(own, self.device)
        return out

    # ----------------------------------------------------------------- checkpoint
    def save(self, path: str | Path) -> None:
        """Write model, optimizer and lr-schedule state to ``path`` (``checkpoint_io.save_state``:
        every rank writes its shards; collective). Loadable at any TP/PP/DP."""
        offloaded = self._offloaded
        self.onload()  # the checkpoint holds the optimizer state where training uses it
        save_state(self, Path(path))
        if offloaded:  # back to host before the next rollout: the engine's KV cache wakes into that room
            self.offload()

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by ``save`` at any parallel layout (resharded on load).
        A checkpoint of a different model is refused before anything is changed."""
        self.onload()
        self.version = load_state(self, Path(path))
