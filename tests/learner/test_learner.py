"""The Megatron learner (``pc_megatron/learner/learner.py``) against the transformers model (CPU, gloo):
log-probs, SFT and RL steps, a non-finite loss, truncated IS, the Triton loss path, fused old
log-probs; ragged batches through token-budget micro-batches (the caller's order, the aggregation
modes). Marked ``gpu`` (skipped on CPU): the same on CUDA with the TE layer spec, packed micro-batches,
bf16, FP8 and sequence parallelism."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from pc_megatron.algo.config import LossConfig
from pc_megatron.batch import TokenBatch, completions_to_batch, logprob_mismatch
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner
from pc_megatron.rollout.config import SamplingParams
from pc_megatron.rollout.hf_engine import HFEngine
from pc_megatron.weight_sync import mapping
from tests.hf_models import make_hf_model
from tests.tensor_checks import assert_close_to_scale, scaled_error
from tests.torchrun import torchrun
from tests.workers.parallel_worker import ragged_batch


def hf_logprobs(model, tokens):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


def test_learner_logprobs_match_transformers(tiny_model_dir, learner):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    tokens = torch.randint(0, 23, (5, 11), generator=torch.Generator().manual_seed(0))
    ours = learner.logprobs(TokenBatch(tokens, torch.ones(5, 10)))
    assert (ours - hf_logprobs(model, tokens)).abs().max() < 1e-4


def test_negative_control_swapped_k_and_v_breaks_parity(tiny_model_dir, monkeypatch):
    """The parity test bites: the same check with k and v swapped in the mapping fails."""
    real = mapping._merge_qkv
    monkeypatch.setattr(mapping, "_merge_qkv", lambda q, k, v, arch: real(q, v, k, arch))
    bad = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    tokens = torch.randint(0, 23, (4, 9), generator=torch.Generator().manual_seed(1))
    assert (bad.logprobs(TokenBatch(tokens, torch.ones(4, 8))) - hf_logprobs(model, tokens)).abs().max() > 1e-3


def test_sft_step_lowers_the_loss_on_its_batch(tiny_model_dir):
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, micro_batch_size=2), seed=0)
    tokens = torch.randint(2, 23, (4, 8), generator=torch.Generator().manual_seed(2))
    batch = TokenBatch(tokens, torch.ones(4, 7))
    first = learner.train_sft(batch)["loss"]
    for _ in range(5):
        last = learner.train_sft(batch)["loss"]
    assert last < first - 0.1 and learner.version == 6


def test_nan_loss_stops_with_a_clear_error_and_applies_nothing(tiny_model_dir):
    from pc_megatron.algo.config import LossConfig
    from pc_megatron.errors import TrainingError

    learner = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    before = {n: p.detach().clone() for n, p in learner.module.named_parameters()}
    tokens = torch.randint(2, 23, (2, 6), generator=torch.Generator().manual_seed(3))
    batch = TokenBatch(tokens, torch.ones(2, 5))
    old = learner.logprobs(batch)
    with pytest.raises(TrainingError, match="non-finite loss.*last checkpoint is intact"):
        learner.train_rl(batch, old, torch.tensor([float("nan"), 1.0]), LossConfig(correction="none"), 1.0)
    assert learner.version == 0
    for n, p in learner.module.named_parameters():
        assert torch.equal(p, before[n])


def _results(stats: dict) -> dict:
    """A step's results without its timings (``time_*``: measurements, not state)."""
    return {k: v for k, v in stats.items() if not k.startswith("time_")}


def test_triton_loss_path_matches_the_torch_reference_in_the_learner(tiny_model_dir):
    """learner.loss_impl=triton (interpreter on CPU) computes the same log-probs and gradients.
    (Compared before Adam: its first step is ~lr * sign(g), which amplifies rounding near g = 0.)"""
    from pc_megatron.algo.config import LossConfig

    tokens = torch.randint(2, 23, (3, 7), generator=torch.Generator().manual_seed(4))
    batch = TokenBatch(tokens, torch.ones(3, 6))
    learners = {impl: Learner(tiny_model_dir, LearnerConfig(loss_impl=impl), seed=0) for impl in ("torch", "triton")}
    old = {impl: lrn.logprobs(batch, 0.9) for impl, lrn in learners.items()}
    assert torch.allclose(old["torch"], old["triton"], atol=1e-5)
    adv = torch.tensor([1.0, -0.5, 0.3])
    for lrn in learners.values():
        lrn.train_rl(batch, old["torch"], adv, LossConfig(correction="none"), 0.9)
    grads = {impl: {n: p.main_grad for n, p in lrn.module.named_parameters()} for impl, lrn in learners.items()}
    for name, g in grads["torch"].items():
        assert g.abs().max() > 0 and torch.allclose(g, grads["triton"][name], rtol=1e-4, atol=1e-7), name


def test_truncated_is_weights_scale_each_tokens_policy_gradient(tiny_model_dir):
    """algo.loss.correction=tis: the weight w = pi_old / pi_behaviour multiplies that token's advantage,
    so a weight that is constant along a row equals scaling the row's advantage, and w = 1 (the
    engine sampled with the learner's weights) changes nothing."""
    from pc_megatron.algo.config import LossConfig

    tokens = torch.randint(2, 23, (3, 7), generator=torch.Generator().manual_seed(5))
    batch = TokenBatch(tokens, torch.ones(3, 6))
    adv = torch.tensor([1.0, -0.5, 0.3])
    row_w = torch.tensor([2.0, 0.5, 1.5])
    runs = {
        "none": (adv, None),
        "ones": (adv, torch.ones(3, 1)),
        "weighted": (adv, row_w[:, None]),
        "scaled_adv": (adv * row_w, None),
    }
    grads = {}
    for name, (a, w) in runs.items():
        lrn = Learner(tiny_model_dir, LearnerConfig(), seed=0)
        old = lrn.logprobs(batch)
        cfg = LossConfig(tis_cap=10.0, correction="tis" if w is not None else "none")
        behaviour = old - torch.log(w) if w is not None else None  # so that pi_old / pi_behaviour = w
        stats = lrn.train_rl(batch, old, a, cfg, 1.0, behaviour_logp=behaviour)
        if w is not None:
            assert stats["correction/weight_mean"] == pytest.approx(float(w.mean()), rel=1e-5)
        grads[name] = {n: p.main_grad.clone() for n, p in lrn.module.named_parameters()}
    for n, g in grads["none"].items():
        # the paths round differently (by the machine's vector width): compare to each tensor's scale
        assert_close_to_scale(grads["ones"][n], g, 1e-6, n)
        assert_close_to_scale(grads["weighted"][n], grads["scaled_adv"][n], 1e-5, n)
    assert any(not torch.allclose(grads["weighted"][n], g) for n, g in grads["none"].items())


def test_fused_old_logprobs_give_the_separate_pass_update(tiny_model_dir):
    """algo.old_logprobs=fused: the update's own forward gives the old log-probs; the step, its
    statistics and the returned log-probs equal those of a separate forward pass first."""
    from pc_megatron.algo.config import LossConfig

    tokens = torch.randint(2, 23, (4, 9), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(4, 8)
    mask[1, :3] = 0
    batch = TokenBatch(tokens, mask)
    adv = torch.tensor([1.0, -0.5, 0.3, -0.8])
    cfg = LossConfig(correction="tis", tis_cap=2.0)
    out = {}
    for mode in ("separate", "fused"):
        lrn = Learner(tiny_model_dir, LearnerConfig(micro_batch_size=2), seed=0)
        old = lrn.logprobs(batch, 0.9)
        behaviour = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
        stats = lrn.train_rl(batch, old if mode == "separate" else None, adv, cfg, 0.9, behaviour_logp=behaviour)
        out[mode] = (old, stats, {n: p.detach().clone() for n, p in lrn.module.named_parameters()})
    (old, s_sep, w_sep), (_, s_fused, w_fused) = out["separate"], out["fused"]
    assert torch.allclose(s_fused.pop("old_logp") * mask, old * mask, atol=1e-6)
    for k, v in _results(s_sep).items():
        assert s_fused[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert 0 < s_sep["correction/clipped_frac"] < 1 and s_sep["grad_norm"] > 0
    for n, w in w_sep.items():
        assert torch.allclose(w, w_fused[n], rtol=1e-5, atol=1e-7), n


# ------------------------------------------------------------------ one process
def _grads(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.clone() for n, p in learner.module.named_parameters()}


def test_halves_normalised_apart_would_differ(ragged_model):
    """The negative control of the gradient comparison: a token mean per half (then the two halves'
    mean) is a different update from the token mean of the whole batch, far beyond 1e-5."""
    batch, adv = ragged_batch()
    whole = Learner(ragged_model, LearnerConfig(clip_grad=0.0), seed=0)
    whole.train_rl(batch, whole.logprobs(batch), adv, LossConfig(correction="none"), 1.0)
    per_half = []
    for rows in (torch.arange(0, 4), torch.arange(4, 8)):
        lrn = Learner(ragged_model, LearnerConfig(clip_grad=0.0), seed=0)
        part = batch.rows(rows)
        lrn.train_rl(part, lrn.logprobs(part), adv[rows], LossConfig(correction="none"), 1.0)
        per_half.append(_grads(lrn))
    mixed = {n: (per_half[0][n] + per_half[1][n]) / 2 for n in per_half[0]}
    assert max(scaled_error(mixed[n], g) for n, g in _grads(whole).items()) > 1e-3


def test_logprobs_come_back_in_the_callers_order(ragged_model):
    batch, _ = ragged_batch()
    learner = Learner(ragged_model, LearnerConfig(max_tokens_per_micro_batch=160), seed=0)
    perm = torch.tensor([5, 1, 7, 0, 3, 6, 2, 4])
    assert torch.allclose(learner.logprobs(batch.rows(perm)), learner.logprobs(batch)[perm], atol=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_modes_on_the_learner_match_the_hand_computed_loss(ragged_model, agg):
    """At ratio 1 (old = current log-probs) every trained token's loss is -A_i, so the three modes
    are closed forms of the advantages and token counts; and the gradient of a mean over sequences
    is the token mean's with each advantage rescaled by (tokens / sequences) / n_i."""
    batch, adv = ragged_batch()
    n = batch.loss_mask.sum(1)
    want = {
        "token-mean": float((-adv * n).sum() / n.sum()),
        "seq-mean-token-mean": float((-adv).mean()),
        "seq-mean-token-sum-norm": float((-adv * n).sum() / (len(n) * 256)),
    }[agg]
    cfg = LearnerConfig(clip_grad=0.0, max_tokens_per_micro_batch=160)
    learner = Learner(ragged_model, cfg, seed=0)
    stats = learner.train_rl(
        batch, learner.logprobs(batch), adv, LossConfig(agg=agg, norm_tokens=256, correction="none"), 1.0
    )
    assert stats["loss"] == pytest.approx(want, rel=1e-5)
    scale = {
        "token-mean": torch.ones_like(n),
        "seq-mean-token-mean": n.sum() / (len(n) * n),
        "seq-mean-token-sum-norm": n.sum() / (len(n) * 256) * torch.ones_like(n),
    }[agg]
    twin = Learner(ragged_model, cfg, seed=0)
    twin.train_rl(batch, twin.logprobs(batch), adv * scale, LossConfig(correction="none"), 1.0)
    twin_grads = _grads(twin)
    assert max(scaled_error(g, twin_grads[k]) for k, g in _grads(learner).items()) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["local", "transformer_engine"])
def test_learner_on_gpu_matches_the_engine(tiny_model_dir, impl):
    if impl == "transformer_engine":
        pytest.importorskip("transformer_engine")
    learner = Learner(tiny_model_dir, LearnerConfig(transformer_impl=impl), seed=0)
    engine = HFEngine(tiny_model_dir)
    engine.update_weights(learner.hf_named_tensors(), learner.version)
    prompts = [[3, 4, 12, 5, 16], [7, 16]]
    completions = engine.generate(prompts, 4, SamplingParams(temperature=1.0, max_new_tokens=6), seed=0)
    batch, engine_logp = completions_to_batch([prompts[c.prompt_index] for c in completions], completions, pad_id=0)
    _, worst = logprob_mismatch(learner.logprobs(batch), engine_logp, batch.loss_mask)
    assert worst < 1e-3  # TF32/cuBLAS reductions differ from CPU fp32


def _ragged_on(folder, cfg: LearnerConfig):
    """Log-probs and one RL step's gradients (flattened, fp32) of the ragged batch of the shape tests."""
    from pc_megatron.algo.config import LossConfig

    batch, adv = ragged_batch()
    learner = Learner(folder, cfg, seed=0)
    old = learner.logprobs(batch)
    learner.train_rl(batch, old, adv, LossConfig(correction="none"), 1.0)
    grads = torch.cat([p.main_grad.flatten().float() for p in learner.module.parameters()])
    return old, grads, batch


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["local", "transformer_engine"])
def test_packed_micro_batches_on_gpu_equal_the_padded_ones(tmp_path, impl):
    """A ragged batch (lengths 4-200) as fixed padded rows and as packed THD streams under a token
    budget: the same log-probs and gradients. Local spec in fp32 (the packed attention of
    learner/packed_attention.py on CUDA); TE spec in bf16 (TE's THD kernels take half precision)."""
    if impl == "transformer_engine":
        pytest.importorskip("transformer_engine")
    folder = tmp_path / "qwen2"
    make_hf_model("qwen2-tied", folder)
    bf16 = impl == "transformer_engine"
    common = dict(transformer_impl=impl, bf16=bf16, clip_grad=0.0)
    padded = _ragged_on(
        folder, LearnerConfig(max_tokens_per_micro_batch=0, micro_batch_size=3, packing=False, **common)
    )
    packed = _ragged_on(folder, LearnerConfig(max_tokens_per_micro_batch=256, packing=True, **common))
    mask = padded[2].loss_mask > 0
    gap = (padded[0] - packed[0])[mask].abs().max()
    assert gap < (0.05 if bf16 else 1e-4), gap
    cos = torch.nn.functional.cosine_similarity(padded[1], packed[1], dim=0)
    assert cos > (0.99 if bf16 else 0.99999), cos


def _fp8_model(folder):
    """A random Qwen2 of FP8-friendly widths (multiples of 16) whose vocabulary holds the ragged
    batch's token ids (< 96)."""
    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model

    shape = TinyModelConfig(
        num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512, vocab_size=128
    )
    return create_tiny_model(shape, folder)


def test_the_fp8_model_takes_the_ragged_batch(tmp_path):
    """The GPU tests' FP8 model and ragged batch, checked where it runs everywhere (the local spec
    on CPU): every token id fits the vocabulary (an out-of-range id is a device assert on CUDA)."""
    batch, _ = ragged_batch()
    learner = Learner(_fp8_model(tmp_path / "m"), LearnerConfig(max_tokens_per_micro_batch=256), seed=0)
    assert int(batch.tokens.max()) < learner.arch.vocab_size
    assert torch.isfinite(learner.logprobs(batch)).all()


@pytest.mark.gpu
def test_fp8_on_a_ragged_packed_batch(tmp_path):
    """FP8 GEMMs need each micro-batch's tokens in multiples of 16: the planner pads the packed stream
    to that alignment; the step runs and agrees with bf16 to FP8 precision."""
    pytest.importorskip("transformer_engine")
    folder = _fp8_model(tmp_path / "m")
    common = dict(transformer_impl="transformer_engine", bf16=True, max_tokens_per_micro_batch=256, clip_grad=0.0)
    bf16 = _ragged_on(folder, LearnerConfig(**common))
    fp8 = _ragged_on(folder, LearnerConfig(fp8="hybrid", **common))
    mask = bf16[2].loss_mask > 0
    assert torch.nn.functional.cosine_similarity(bf16[0][mask], fp8[0][mask], dim=0) > 0.99
    assert torch.nn.functional.cosine_similarity(bf16[1], fp8[1], dim=0) > 0.9


@pytest.mark.gpu
def test_sequence_parallel_on_a_ragged_batch(tmp_path):
    """TP 2 with sequence parallelism (TE, bf16, two GPUs) on the ragged batch, packed and padded:
    the planner aligns each micro-batch to TP; the loss matches TP 2 without it."""
    if torch.cuda.device_count() < 2:
        pytest.skip("sequence parallelism needs TP >= 2: two GPUs")
    pytest.importorskip("transformer_engine")
    import json

    folder = tmp_path / "qwen2"
    make_hf_model("qwen2-tied", folder)
    losses = {}
    for sp in (False, True):
        extra = {"transformer_impl": "transformer_engine", "bf16": True, "sequence_parallel": sp}
        torchrun(tmp_path / f"sp{sp}", 2, [2, 1, "shape", folder], env={"PCM_SHAPE_EXTRA": json.dumps(extra)})
        losses[sp] = {p.stem: torch.load(p)["loss"] for p in (tmp_path / f"sp{sp}").glob("*-rank0.pt")}
    assert losses[True].keys() == losses[False].keys() and losses[True]
    for key, loss in losses[False].items():
        assert abs(losses[True][key] - loss) < 0.02 * max(abs(loss), 1e-3), key


@pytest.mark.gpu
def test_fp8_with_two_data_parallel_ranks_of_unequal_micro_batch_counts(tmp_path):
    """FP8 (delayed scaling) with DP 2, where the token-budget planner gives the two ranks different
    micro-batch counts: each micro-batch's FP8 context reduces the amax within its tensor-parallel
    group only (``tp_only_amax_red``), so no rank waits in an amax reduction that the other, done
    early, never joins. Every layout's step finishes within the deadline, both data-parallel ranks
    hold the same reduced gradients, and the loss agrees with bf16 to FP8 precision."""
    if torch.cuda.device_count() < 2:
        pytest.skip("data parallelism needs two GPUs")
    pytest.importorskip("transformer_engine")
    import json

    folder = _fp8_model(tmp_path / "m")
    runs = {}
    for name, fp8 in (("bf16", {}), ("fp8", {"fp8": "hybrid", "fp8_recipe": "delayed"})):
        extra = {"transformer_impl": "transformer_engine", "bf16": True, **fp8}
        torchrun(tmp_path / name, 2, [1, 1, "shape", folder], env={"PCM_SHAPE_EXTRA": json.dumps(extra)}, timeout=300)
        runs[name] = {p.stem: torch.load(p, map_location="cpu") for p in (tmp_path / name).glob("m-*-rank*.pt")}
    fp8 = runs["fp8"]
    unequal = {k for k, r in fp8.items() if len(set(r["micro_batches"])) > 1}
    assert unequal, {k: r["micro_batches"] for k, r in fp8.items()}  # the case that deadlocked
    for key, r in fp8.items():
        twin = fp8[key.replace("rank0", "rank1") if "rank0" in key else key.replace("rank1", "rank0")]
        assert r["dp"] != twin["dp"]
        for n, g in r["grads"].items():
            assert torch.equal(g, twin["grads"][n]), f"{key}: {n} differs across data-parallel ranks"
        bf16 = runs["bf16"][key]["loss"]
        assert abs(r["loss"] - bf16) < 0.05 * max(abs(bf16), 1e-3), key


@pytest.mark.gpu
def test_bf16_learner_step_on_gpu(tiny_model_dir):
    learner = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3), seed=0)
    tokens = torch.randint(2, 23, (4, 8), generator=torch.Generator().manual_seed(0))
    batch = TokenBatch(tokens, torch.ones(4, 7))
    first = learner.train_sft(batch)["loss"]
    for _ in range(5):
        last = learner.train_sft(batch)["loss"]
    assert last < first


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_forward_backward_close_to_bf16(tmp_path, recipe):
    """TE spec, bf16 vs bf16 + FP8 GEMMs (hybrid) on a random Qwen2 with FP8-friendly shapes:
    logits and gradients agree to FP8 precision."""
    pytest.importorskip("transformer_engine")
    from pc_megatron.algo.config import LossConfig
    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model

    folder = create_tiny_model(
        TinyModelConfig(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512),
        tmp_path / "m",
    )
    tokens = torch.randint(2, 23, (8, 32), generator=torch.Generator().manual_seed(0)).cuda()
    batch = TokenBatch(tokens, torch.ones(8, 31))
    out = {}
    for name, fp8 in (("bf16", ""), ("fp8", "hybrid")):
        learner = Learner(
            folder, LearnerConfig(bf16=True, fp8=fp8, fp8_recipe=recipe, transformer_impl="transformer_engine"), seed=0
        )
        with torch.no_grad():
            logits = learner.forward_logits(tokens).float()
        learner.train_rl(batch, learner.logprobs(batch), torch.linspace(-1, 1, 8), LossConfig(correction="none"), 1.0)
        grads = torch.cat([p.main_grad.flatten().float() for p in learner.module.parameters()])
        out[name] = (logits, grads)
    cos = torch.nn.functional.cosine_similarity
    assert cos(out["bf16"][0].flatten(), out["fp8"][0].flatten(), dim=0) > 0.99
    assert cos(out["bf16"][1], out["fp8"][1], dim=0) > 0.95


# ------------------------------------------------------------------ shared prompts
def grouped_batch() -> tuple[TokenBatch, torch.Tensor]:
    """Three prompts (lengths 9, 5, 12) with four answers each of 2-7 tokens, right-padded, the loss
    on the answers; and one row of its own prompt. Advantages of both signs."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for plen in (9, 5, 12):
        prompt = torch.randint(1, 96, (plen,), generator=g).tolist()
        for _ in range(4):
            n = int(torch.randint(2, 8, (1,), generator=g))
            rows.append((prompt, torch.randint(1, 96, (n,), generator=g).tolist()))
    rows.append((torch.randint(1, 96, (7,), generator=g).tolist(), [3, 4, 5]))
    width = max(len(p) + len(a) for p, a in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1)
    for i, (p, a) in enumerate(rows):
        tokens[i, : len(p) + len(a)] = torch.tensor(p + a)
        mask[i, len(p) - 1 : len(p) + len(a) - 1] = 1
    adv = torch.randn(len(rows), generator=g)
    return TokenBatch(tokens, mask), adv


@pytest.mark.parametrize("budget", [64, 24])
def test_shared_prompts_give_the_same_logprobs_and_gradients(ragged_model, budget):
    """learner.share_prompts: a group's prompt runs once, its answers attend to it where it lies, with
    positions continuing from it. Log-probs, the loss and every gradient equal the unshared packed
    pass (float rounding apart), while fewer positions are computed. A budget of 24 cuts the
    12-token prompt's group into chunks that carry the prompt again."""
    batch, adv = grouped_batch()
    out = {}
    for share in (False, True):
        cfg = LearnerConfig(clip_grad=0.0, max_tokens_per_micro_batch=budget, share_prompts=share)
        lrn = Learner(ragged_model, cfg, seed=0)
        logp = lrn.logprobs(batch)
        stats = lrn.train_rl(batch, None, adv, LossConfig(correction="none"), 1.0)
        out[share] = (logp, stats, _grads(lrn), lrn.take_pass_stats())
    (lp0, s0, g0, p0), (lp1, s1, g1, p1) = out[False], out[True]
    assert (lp1 - lp0).abs().max() < 1e-5
    assert (lp0 * batch.loss_mask).abs().sum() > 1  # the log-probs are real ones
    assert s1["loss"] == pytest.approx(s0["loss"], rel=1e-5)
    assert max(scaled_error(g1[n], g) for n, g in g0.items()) < 1e-5
    assert p1["train"]["processed"] < 0.8 * p0["train"]["processed"]
    assert p1["train"]["real_tokens"] == p0["train"]["real_tokens"] == p0["train"]["laid"]
    assert p1["train"]["laid"] == p1["train"]["processed"]  # shared, not padded (budget 64 and 24: align 1)


def test_shared_prompts_that_differ_by_one_token_are_not_shared(ragged_model):
    """The negative control: a row whose prompt differs from its group's in one token is laid out
    whole, and a learner that shared it anyway (its prompt swapped for the group's) would score it
    differently: the check above compares against real differences."""
    batch, _ = grouped_batch()
    changed = batch.tokens.clone()
    changed[1, 2] = (changed[1, 2] % 95) + 1
    other = TokenBatch(changed, batch.loss_mask)
    lrn = Learner(ragged_model, LearnerConfig(max_tokens_per_micro_batch=64, share_prompts=True), seed=0)
    plan, _ = lrn._plan(other, 64)
    together = [mb for mb in plan.ranks[0] if 1 in mb.rows and mb.prefix]
    assert not together or together[0].prefix[together[0].rows.index(1)] == 0
    assert (lrn.logprobs(other)[1] - lrn.logprobs(batch)[1]).abs().max() > 1e-3
    plain = Learner(ragged_model, LearnerConfig(max_tokens_per_micro_batch=64), seed=0)
    assert (lrn.logprobs(other) - plain.logprobs(other)).abs().max() < 1e-5


def test_shared_prompts_are_refused_without_packing(ragged_model):
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="share_prompts.*learner.packing=true"):
        Learner(ragged_model, LearnerConfig(packing=False, share_prompts=True), seed=0)
