"""Triton kernels: per-token log-prob and entropy of ``softmax(logits / T)`` without ever
materialising the ``(T, V)`` float32 log-softmax, and the logits gradient written chunk by chunk.

For one token row ``x = logits / T`` (length V) and target ``y``, the forward kernel makes one
pass over the vocabulary in ``BLOCK`` chunks with an online log-sum-exp:

    m_k  = max(m_{k-1}, max(x_chunk))
    s_k  = s_{k-1} exp(m_{k-1} - m_k) + sum exp(x_chunk - m_k)          (s = sum exp(x - m))
    u_k  = u_{k-1} exp(m_{k-1} - m_k) + sum exp(x_chunk - m_k) x_chunk  (u = sum exp(x - m) x)
    lse  = m + log s,   logp = x_y - lse,   H = lse - u / s

and stores ``logp``, ``H`` and ``lse`` (three floats per token). The backward kernel re-reads the
logits, recomputes ``p = exp(x - lse)`` chunk by chunk and writes

    dlogits_v = (g_logp (1[v = y] - p_v) - g_H p_v (x_v - lse + H)) / T

in the logits' dtype. Memory beyond inputs and the gradient: O(T).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _logprob_entropy_fwd(
    logits_ptr, stride_row, targets_ptr, logp_ptr, entropy_ptr, lse_ptr, V, inv_temp, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    u = tl.full((), 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < V
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(x, axis=0))
        scale = tl.exp(m - m_new)
        e = tl.where(valid, tl.exp(x - m_new), 0.0)
        s = s * scale + tl.sum(e, axis=0)
        u = u * scale + tl.sum(e * tl.where(valid, x, 0.0), axis=0)  # no 0 * -inf on padding
        m = m_new
    lse = m + tl.log(s)
    y = tl.load(targets_ptr + row)
    x_y = tl.load(base + y).to(tl.float32) * inv_temp
    tl.store(logp_ptr + row, x_y - lse)
    tl.store(entropy_ptr + row, lse - u / s)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _logprob_entropy_bwd(
    logits_ptr,
    stride_row,
    targets_ptr,
    lse_ptr,
    entropy_ptr,
    grad_logp_ptr,
    grad_entropy_ptr,
    dlogits_ptr,
    stride_drow,
    V,
    inv_temp,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    dbase = dlogits_ptr + row * stride_drow
    lse = tl.load(lse_ptr + row)
    ent = tl.load(entropy_ptr + row)
    g_logp = tl.load(grad_logp_ptr + row)
    g_ent = tl.load(grad_entropy_ptr + row)
    y = tl.load(targets_ptr + row)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < V
        x = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temp
        logp_v = x - lse
        p = tl.exp(logp_v)
        onehot = tl.where(cols == y, 1.0, 0.0)
        g = g_logp * (onehot - p) - g_ent * p * (logp_v + ent)
        tl.store(dbase + cols, (g * inv_temp).to(dlogits_ptr.dtype.element_ty), mask=valid)


def _block(V: int) -> int:
    return min(4096, triton.next_power_of_2(V))


class LogProbEntropy(torch.autograd.Function):
    """``(logits (T, V), targets (T,), temperature) -> (logp (T,), entropy (T,))``, float32."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float):
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        T, V = logits.shape
        logp = torch.empty(T, dtype=torch.float32, device=logits.device)
        entropy = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        if T:
            _logprob_entropy_fwd[(T,)](
                logits, logits.stride(0), targets, logp, entropy, lse, V, 1.0 / temperature, BLOCK=_block(V)
            )
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.inv_temp = 1.0 / temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, targets, lse, entropy = ctx.saved_tensors
        T, V = logits.shape
        zeros = torch.zeros(T, dtype=torch.float32, device=logits.device)
        grad_logp = zeros if grad_logp is None else grad_logp.float().contiguous()
        grad_entropy = zeros if grad_entropy is None else grad_entropy.float().contiguous()
        dlogits = torch.empty_like(logits)
        if T:
            _logprob_entropy_bwd[(T,)](
                logits,
                logits.stride(0),
                targets,
                lse,
                entropy,
                grad_logp,
                grad_entropy,
                dlogits,
                dlogits.stride(0),
                V,
                ctx.inv_temp,
                BLOCK=_block(V),
            )
        return dlogits, None, None


@triton.jit
def _group_advantages_kernel(rewards_ptr, out_ptr, group_size, eps, NORMALIZE: tl.constexpr, BLOCK: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < group_size
    r = tl.load(rewards_ptr + g * group_size + cols, mask=valid, other=0.0).to(tl.float32)
    mean = tl.sum(r, axis=0) / group_size
    centered = tl.where(valid, r - mean, 0.0)
    if NORMALIZE:
        var = tl.sum(centered * centered, axis=0) / tl.maximum(group_size - 1, 1)
        centered = centered / (tl.sqrt(var) + eps)
    # A group of identical rewards has exactly zero advantage. The GPU's fp32 division is not
    # exact (six rewards of 1.0 gave a mean of 0.99999994), and dividing that residue by eps
    # would turn a degenerate group into a -0.03 advantage: test the spread, not the residue.
    spread = tl.max(tl.where(valid, r, -float("inf")), axis=0) - tl.min(tl.where(valid, r, float("inf")), axis=0)
    centered = tl.where(spread == 0.0, 0.0, centered)
    tl.store(out_ptr + g * group_size + cols, centered, mask=valid)


def group_advantages_triton(
    rewards: torch.Tensor, group_size: int, normalize_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """One program per contiguous group; see ``reference.group_advantages_reference``."""
    rewards = rewards.contiguous()
    out = torch.empty(rewards.shape, dtype=torch.float32, device=rewards.device)
    groups = rewards.numel() // group_size
    if groups:
        _group_advantages_kernel[(groups,)](
            rewards, out, group_size, eps, NORMALIZE=normalize_by_std, BLOCK=triton.next_power_of_2(group_size)
        )
    return out
