"""GRPO loss for large batches without the ``(tokens, vocab)`` float32 log-softmax.

    from kernels.grpo_loss import grpo_loss
    out = grpo_loss(logits, targets, old_logp, advantages, mask, temperature=1.0)
    out.loss.backward()

Math, per token ``t`` with ``x = logits[t] / temperature`` and target ``y``:

    logp_t    = x_y - logsumexp(x)                      entropy_t = -sum_v p_v log p_v
    r_t       = exp(logp_t - old_logp_t)
    loss_t    = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))
                + kl_coef * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)      (optional)
    loss      = sum_t mask_t loss_t / max(sum_t mask_t, 1)                    (token mean)

The vocabulary-sized work (log-sum-exp, target gather, entropy, and the logits gradient) runs in
the Triton kernels of ``triton_impl`` in one pass over the vocabulary per row; the O(tokens)
surrogate math is ``reference.clipped_surrogate`` under autograd, shared with the reference
path so both compute the same function. ``fused_linear_grpo_loss`` goes one step further and
never holds more than a ``(chunk, V)`` slice of the logits.

``impl``: ``"triton"`` (CUDA tensors, or CPU tensors with ``TRITON_INTERPRET=1``), ``"torch"``
(the reference), or ``"auto"`` (triton on CUDA, torch otherwise).

Vocabulary-parallel logits (sharded over tensor-parallel ranks) are not supported: passing a
``tp_group`` with more than one rank raises ``ValueError``; gather the logits first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kernels.grpo_loss.reference import (
    clipped_surrogate,
    group_advantages_reference,
    logprob_entropy_reference,
)

__all__ = [
    "GRPOLossOutput",
    "clipped_surrogate",
    "fused_linear_grpo_loss",
    "group_advantages",
    "grpo_loss",
    "logprob_entropy",
    "resolve_impl",
]


@dataclass
class GRPOLossOutput:
    loss: torch.Tensor
    """Scalar token-mean loss (differentiable)."""
    logp: torch.Tensor
    """``(T,) float32`` log-probs of the targets (differentiable for ``grpo_loss``)."""
    entropy: torch.Tensor
    """``(T,) float32`` entropy of each token's distribution."""
    clipfrac: torch.Tensor
    """Fraction of unmasked tokens where the clip was active."""


def resolve_impl(impl: str, device: torch.device) -> str:
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"impl must be 'auto', 'triton' or 'torch', got {impl!r}")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if impl == "triton" and device.type != "cuda" and not interpret:
        raise ValueError("impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tests); use impl='torch'")
    return impl


def _check_tp(tp_group) -> None:
    if tp_group is not None and torch.distributed.get_world_size(tp_group) > 1:
        raise ValueError(
            "vocabulary-parallel logits are not supported by kernels.grpo_loss (it needs a cross-rank "
            "log-sum-exp); gather the logits over the tensor-parallel group first"
        )


def logprob_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits: (T, V)`` bf16/fp16/fp32, ``targets: (T,) int64`` in ``[0, V)`` (masked rows too)
    → ``(logp, entropy)`` each ``(T,) float32``, differentiable w.r.t. ``logits``."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits (T, V) and targets (T,), got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if resolve_impl(impl, logits.device) == "torch":
        return logprob_entropy_reference(logits, targets, temperature)
    from kernels.grpo_loss.triton_impl import LogProbEntropy

    return LogProbEntropy.apply(logits, targets.contiguous(), float(temperature))


def _reduce(loss_t, clipped, mask, num_tokens):
    return (loss_t * mask).sum() / num_tokens, (clipped * mask).sum() / num_tokens


def grpo_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    impl: str = "auto",
    tp_group=None,
) -> GRPOLossOutput:
    """Token-mean clipped-surrogate loss over ``logits: (T, V)``; every other input ``(T,)``."""
    _check_tp(tp_group)
    logp, entropy = logprob_entropy(logits, targets, temperature, impl)
    mask = mask.float()
    loss_t, clipped, _ = clipped_surrogate(
        logp, old_logp.float(), advantages.float(), clip_low, clip_high, ref_logp, kl_coef
    )
    num_tokens = mask.sum().clamp(min=1.0)
    loss, clipfrac = _reduce(loss_t, clipped, mask, num_tokens)
    return GRPOLossOutput(loss, logp, entropy.detach(), clipfrac)


class _FusedLinearGRPO(torch.autograd.Function):
    """Chunks over tokens: logits chunk = hidden_c @ weight.T, loss and its gradients w.r.t.
    hidden and weight computed at once (as the loss is the output, its upstream gradient is a
    scalar applied in backward). Peak extra memory: one ``(chunk, V)`` logits slice + its grad."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, old_logp, advantages, mask, ref_logp, opts):
        temperature, clip_low, clip_high, kl_coef, chunk, impl = opts
        T = hidden.shape[0]
        mask = mask.float()
        num_tokens = mask.sum().clamp(min=1.0)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        logp_all = torch.empty(T, dtype=torch.float32, device=hidden.device)
        entropy_all = torch.empty_like(logp_all)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        clipped_total = torch.zeros_like(total)
        for start in range(0, T, chunk):
            sl = slice(start, min(start + chunk, T))
            with torch.enable_grad():
                logits = (hidden[sl] @ weight.T).detach().requires_grad_()
                logp, entropy = logprob_entropy(logits, targets[sl], temperature, impl)
                ref = ref_logp[sl] if ref_logp is not None else None
                loss_t, clipped, _ = clipped_surrogate(
                    logp, old_logp[sl].float(), advantages[sl].float(), clip_low, clip_high, ref, kl_coef
                )
                part, clip_part = _reduce(loss_t, clipped, mask[sl], num_tokens)
                (dlogits,) = torch.autograd.grad(part, logits)
            grad_hidden[sl] = (dlogits @ weight).to(hidden.dtype)
            # in the inputs' dtype: cuBLAS accumulates each chunk's product in fp32 and the chunks
            # add up in fp32 here (an fp32 GEMM here ran at fp32 rate, 3x the whole forward on an H200)
            grad_weight += (dlogits.to(hidden.dtype).T @ hidden[sl]).float()
            logp_all[sl], entropy_all[sl] = logp.detach(), entropy.detach()
            total += part.detach()
            clipped_total += clip_part
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(logp_all, entropy_all, clipped_total)
        return total, logp_all, entropy_all, clipped_total

    @staticmethod
    def backward(ctx, grad_loss, *_):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None, None, None, None


def fused_linear_grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    chunk_size: int = 4096,
    impl: str = "auto",
    tp_group=None,
) -> GRPOLossOutput:
    """The same loss from ``hidden: (T, H)`` and the output layer ``weight: (V, H)``; the full
    ``(T, V)`` logits never exist. Gradients flow to ``hidden`` and ``weight``; ``logp`` and
    ``entropy`` are returned detached."""
    _check_tp(tp_group)
    opts = (float(temperature), clip_low, clip_high, kl_coef, int(chunk_size), impl)
    loss, logp, entropy, clipfrac = _FusedLinearGRPO.apply(
        hidden, weight, targets, old_logp, advantages, mask, ref_logp, opts
    )
    return GRPOLossOutput(loss, logp, entropy, clipfrac)


def group_advantages(
    rewards: torch.Tensor, group_size: int, normalize_by_std: bool = True, eps: float = 1e-6, impl: str = "auto"
) -> torch.Tensor:
    """Contiguous groups of ``group_size`` (group-major) → ``(N,) float32`` advantages: reward
    minus group mean, divided by (unbiased std + eps) when ``normalize_by_std`` (GRPO), not
    (Dr.GRPO)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if resolve_impl(impl, rewards.device) == "torch":
        return group_advantages_reference(rewards, group_size, normalize_by_std, eps)
    from kernels.grpo_loss.triton_impl import group_advantages_triton

    return group_advantages_triton(rewards, group_size, normalize_by_std, eps)
