"""kernels.grpo_loss: Triton kernels against float64 references.

CPU: runs with TRITON_INTERPRET=1 (set in conftest) at small shapes. With CUDA the same tests
run the compiled kernels on the GPU (every input is made on ``DEVICE``); the bf16-vs-fp32
tolerance test at a realistic vocabulary is marked ``gpu``.
"""

import pytest
import torch

pytest.importorskip("triton")

from kernels.grpo_loss import (
    fused_linear_grpo_loss,
    group_advantages,
    grpo_loss,
    logprob_entropy,
)
from kernels.grpo_loss.reference import clipped_surrogate, logprob_entropy_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def reference_loss(logits, targets, old, adv, mask, temperature, clip_low=0.2, clip_high=0.28, ref=None, kl=0.0):
    logp, _ = logprob_entropy_reference(logits, targets, temperature)
    loss_t, _, _ = clipped_surrogate(logp, old, adv, clip_low, clip_high, ref, kl)
    return (loss_t * mask).sum() / mask.sum().clamp(min=1)


def inputs(T, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(T, V, generator=g)).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    with torch.no_grad():
        logp, _ = logprob_entropy_reference(logits.double(), targets, 1.0)
    old = logp.float() + 0.3 * torch.randn(T, generator=g)  # ratios around 1, some clipped
    adv = torch.randn(T, generator=g)
    mask = (torch.rand(T, generator=g) > 0.25).float()
    return tuple(t.to(DEVICE) for t in (logits, targets, old, adv, mask))


@pytest.mark.parametrize("V", [37, 64, 4100])  # below, at, and across the block size (4096)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprob_entropy_values_and_gradients_match_float64(V, temperature):
    logits, targets, *_ = inputs(4, V, seed=V)
    x = logits.clone().requires_grad_()
    logp, ent = logprob_entropy(x, targets, temperature, impl="triton")
    xd = logits.double().requires_grad_()
    logp_ref, ent_ref = logprob_entropy_reference(xd, targets, temperature)
    assert torch.allclose(logp.double(), logp_ref, atol=2e-5) and torch.allclose(ent.double(), ent_ref, atol=2e-5)
    g1, g2 = torch.randn(2, 4, dtype=torch.float64, device=DEVICE)  # random upstream gradients
    (gx,) = torch.autograd.grad((logp * g1.float()).sum() + (ent * g2.float()).sum(), x)
    (gref,) = torch.autograd.grad((logp_ref * g1).sum() + (ent_ref * g2).sum(), xd)
    assert torch.allclose(gx.double(), gref, atol=1e-5)


@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_grpo_loss_and_logits_gradient_match_float64(kl):
    logits, targets, old, adv, mask = inputs(6, 53, seed=1)
    ref = old + 0.05 if kl else None
    x = logits.clone().requires_grad_()
    out = grpo_loss(x, targets, old, adv, mask, temperature=0.8, ref_logp=ref, kl_coef=kl, impl="triton")
    scale = torch.randn((), device=DEVICE)
    (out.loss * scale).backward()
    xd = logits.double().requires_grad_()
    expected = reference_loss(
        xd, targets, old.double(), adv.double(), mask.double(), 0.8, ref=None if ref is None else ref.double(), kl=kl
    )
    (expected * scale.double()).backward()
    assert abs(out.loss.item() - expected.item()) < 1e-5
    assert torch.allclose(x.grad.double(), xd.grad, atol=1e-6)


def test_fully_masked_rows_get_no_gradient_and_all_masked_is_zero():
    logits, targets, old, adv, _ = inputs(5, 40, seed=2)
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0], device=DEVICE)
    x = logits.clone().requires_grad_()
    grpo_loss(x, targets, old, adv, mask, impl="triton").loss.backward()
    assert torch.all(x.grad[mask == 0] == 0) and torch.any(x.grad[mask == 1] != 0)
    x.grad = None
    out = grpo_loss(x, targets, old, adv, torch.zeros(5, device=DEVICE), impl="triton")
    out.loss.backward()
    assert out.loss.item() == 0 and torch.all(x.grad == 0)


def test_tokens_exactly_at_the_clip_boundaries():
    """With clip_low = clip_high = 0 and old_logp equal to each path's own logp, every ratio is
    exactly 1.0, i.e. on both clip boundaries at once. Clipping is inclusive, so the gradient
    still flows: d loss / d logp_t = -A_t / N for every token, in the kernel and the reference."""
    logits, targets, _, adv, _ = inputs(4, 30, seed=3)
    mask = torch.ones(4, device=DEVICE)
    x = logits.clone().requires_grad_()
    with torch.no_grad():
        own_old, _ = logprob_entropy(logits, targets, 1.0, impl="triton")
    grpo_loss(x, targets, own_old, adv, mask, clip_low=0.0, clip_high=0.0, impl="triton").loss.backward()
    xd = logits.double().requires_grad_()
    logp_ref, _ = logprob_entropy_reference(xd, targets, 1.0)
    reference_loss(xd, targets, logp_ref.detach(), adv.double(), mask.double(), 1.0, 0.0, 0.0).backward()
    assert torch.allclose(x.grad.double(), xd.grad, atol=1e-6)
    # and that is the unclipped gradient: -A/N * d logp / d logits
    xu = logits.double().requires_grad_()
    lp, _ = logprob_entropy_reference(xu, targets, 1.0)
    (-(adv.double() * lp).sum() / 4).backward()
    assert torch.allclose(xd.grad, xu.grad, atol=1e-12)


def test_bf16_logits_in_the_interpreter_stay_close_to_fp32():
    logits, targets, *_ = inputs(4, 70, seed=4)
    lp16, en16 = logprob_entropy(logits.bfloat16(), targets, 1.0, impl="triton")
    lp32, en32 = logprob_entropy_reference(logits.bfloat16().float(), targets, 1.0)
    assert torch.allclose(lp16, lp32, atol=1e-4) and torch.allclose(en16, en32, atol=1e-4)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_fused_linear_matches_explicit_logits(impl):
    g = torch.Generator().manual_seed(5)
    T, H, V = 7, 16, 45
    hidden = torch.randn(T, H, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    weight = (0.3 * torch.randn(V, H, generator=g, dtype=torch.float64)).to(DEVICE).requires_grad_()
    _, targets, old, adv, mask = inputs(T, V, seed=6)
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    out = fused_linear_grpo_loss(h32, w32, targets, old, adv, mask, temperature=0.9, chunk_size=3, impl=impl)
    scale = 0.7
    (out.loss * scale).backward()
    expected = reference_loss(hidden @ weight.T, targets, old.double(), adv.double(), mask.double(), 0.9)
    (expected * scale).backward()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(h32.grad.double(), hidden.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(w32.grad.double(), weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("normalize", [True, False])
def test_group_advantages_kernel_matches_the_learner_reference(normalize):
    from pc_megatron.algo.advantages import group_advantages as learner_reference

    rewards = torch.randint(0, 2, (5 * 6,)).float().to(DEVICE)
    rewards[:6] = 1.0  # one degenerate group
    ours = group_advantages(rewards, 6, normalize, impl="triton")
    ref = learner_reference(rewards, torch.arange(5, device=DEVICE).repeat_interleave(6), normalize)
    assert torch.allclose(ours, ref, atol=1e-5) and torch.all(ours[:6] == 0)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="expected logits"):
        logprob_entropy(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="impl must be"):
        logprob_entropy(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), impl="cuda")
    with pytest.raises(ValueError, match="do not split"):
        group_advantages(torch.zeros(7), 3)


@pytest.mark.gpu
def test_bf16_kernel_and_bf16_reference_within_tolerance_of_fp32_on_gpu():
    logits, targets, old, adv, mask = (t.cuda() for t in inputs(512, 32_000, seed=7))
    fp32 = grpo_loss(logits, targets, old, adv, mask, impl="torch")
    kernel = grpo_loss(logits.bfloat16(), targets, old, adv, mask, impl="triton")
    ref16 = grpo_loss(logits.bfloat16(), targets, old, adv, mask, impl="torch")
    for out in (kernel, ref16):
        assert abs(out.loss.item() - fp32.loss.item()) < 5e-2
        assert (out.logp - fp32.logp).abs().max() < 5e-2


def _tp_worker(rank: int, port: int, result_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        grpo_loss(
            torch.zeros(2, 5),
            torch.zeros(2, dtype=torch.long),
            torch.zeros(2),
            torch.zeros(2),
            torch.ones(2),
            impl="torch",
            tp_group=dist.group.WORLD,
        )
        message = "no error"
    except ValueError as e:
        message = str(e)
    if rank == 0:
        with open(result_file, "w") as f:
            f.write(message)
    dist.destroy_process_group()


def test_vocab_parallel_logits_are_refused_with_the_fix(tmp_path):
    """Two gloo ranks: a tensor-parallel group of size 2 is rejected, naming the fix."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "msg.txt"
    mp.spawn(_tp_worker, args=(port, str(out)), nprocs=2)
    assert "vocabulary-parallel logits are not supported" in out.read_text()
    assert "gather the logits" in out.read_text()
