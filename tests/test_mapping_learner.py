"""HF ↔ Megatron mapping and the Megatron learner against the transformers model (CPU, gloo)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from pc_megatron.batch import TokenBatch
from pc_megatron.learner import Learner, LearnerConfig
from pc_megatron.learner.export import load_hf_weights
from pc_megatron.weight_sync import mapping
from tests.tensor_checks import assert_close_to_scale


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    return Learner(tiny_model_dir, LearnerConfig(micro_batch_size=3), seed=0)


def _results(stats: dict) -> dict:
    """A step's results without its timings (``time_*``: measurements, not state)."""
    return {k: v for k, v in stats.items() if not k.startswith("time_")}


def hf_logprobs(model, tokens):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


def test_hf_to_megatron_to_hf_is_bit_identical(tiny_model_dir, learner):
    hf = load_hf_weights(tiny_model_dir)
    back = dict(learner.hf_named_tensors())
    assert set(back) == set(hf) - {"lm_head.weight"}  # tied: lm_head is embed_tokens
    for name, t in back.items():
        assert torch.equal(t.cpu(), hf[name]), name


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


def test_weights_from_a_different_model_are_rejected(tmp_path, learner):
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.errors import ModelFileError
    from pc_megatron.model.config import TinyModelConfig

    other = create_tiny_model(
        TinyModelConfig(num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=384),
        tmp_path / "other",
    )
    with pytest.raises(ModelFileError, match="expects"):
        learner.weights.load_hf(other)


def test_missing_and_truncated_weight_files_give_clear_errors(tmp_path, tiny_model_dir):
    import shutil

    from pc_megatron.errors import ModelFileError

    broken = tmp_path / "m"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="unreadable safetensors"):
        load_hf_weights(broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelFileError, match="no \\*.safetensors"):
        load_hf_weights(broken)
    with pytest.raises(ModelFileError, match="config.json"):
        Learner(tmp_path / "nowhere", LearnerConfig(), seed=0)


def test_sft_step_lowers_the_loss_on_its_batch(tiny_model_dir):
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-2, micro_batch_size=2), seed=0)
    tokens = torch.randint(2, 23, (4, 8), generator=torch.Generator().manual_seed(2))
    batch = TokenBatch(tokens, torch.ones(4, 7))
    first = learner.train_sft(batch)["loss"]
    for _ in range(5):
        last = learner.train_sft(batch)["loss"]
    assert last < first - 0.1 and learner.version == 6


def test_nan_loss_stops_with_a_clear_error_and_applies_nothing(tiny_model_dir):
    from pc_megatron.algo import LossConfig
    from pc_megatron.errors import TrainingError

    learner = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    before = {n: p.detach().clone() for n, p in learner.module.named_parameters()}
    tokens = torch.randint(2, 23, (2, 6), generator=torch.Generator().manual_seed(3))
    batch = TokenBatch(tokens, torch.ones(2, 5))
    old = learner.logprobs(batch)
    with pytest.raises(TrainingError, match="non-finite loss.*last checkpoint is intact"):
        learner.train_rl(batch, old, torch.tensor([float("nan"), 1.0]), LossConfig(), 1.0)
    assert learner.version == 0
    for n, p in learner.module.named_parameters():
        assert torch.equal(p, before[n])


def test_checkpoint_from_a_different_model_is_rejected(tiny_model_dir, tmp_path):
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.errors import ModelFileError
    from pc_megatron.model.config import TinyModelConfig

    other_dir = create_tiny_model(
        TinyModelConfig(num_layers=3, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256),
        tmp_path / "three",
    )
    Learner(other_dir, LearnerConfig(), seed=0).save(tmp_path / "ckpt")
    learner = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    before = {n: p.detach().clone() for n, p in learner.module.named_parameters()}
    with pytest.raises(ModelFileError, match="different model.*num_layers"):
        learner.load(tmp_path / "ckpt")
    for n, p in learner.module.named_parameters():
        assert torch.equal(p, before[n])
    learner.save(tmp_path / "mine")
    for shard in (tmp_path / "mine").glob("*.distcp"):  # truncated: one clear error
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    with pytest.raises(ModelFileError, match="cannot load the learner checkpoint.*earlier checkpoint"):
        learner.load(tmp_path / "mine")


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_saved_learner_resumes_exactly(tiny_model_dir, tmp_path, distributed_optimizer):
    """Model, Adam moments, Adam step counts and lr schedule come back: the step after a
    save/load equals the step the original learner takes."""
    from pc_megatron.algo import LossConfig

    cfg = LearnerConfig(lr_warmup_steps=3, distributed_optimizer=distributed_optimizer)
    tokens = torch.randint(2, 23, (3, 7), generator=torch.Generator().manual_seed(5))
    batch = TokenBatch(tokens, torch.ones(3, 6))
    adv = torch.tensor([1.0, -0.5, 0.3])
    first = Learner(tiny_model_dir, cfg, seed=0)
    first.train_rl(batch, first.logprobs(batch), adv, LossConfig(), 1.0)
    first.save(tmp_path / "ckpt")
    second = Learner(tiny_model_dir, cfg, seed=1)
    second.load(tmp_path / "ckpt")
    assert second.version == 1
    weights_only = Learner(tiny_model_dir, cfg, seed=1)  # the control: same weights, fresh optimizer
    with torch.no_grad():
        for p, q in zip(weights_only.module.parameters(), second.module.parameters(), strict=True):
            p.copy_(q)
    for lrn in (first, second, weights_only):
        old = lrn.logprobs(batch)
        lrn.stats = _results(lrn.train_rl(batch, old, adv, LossConfig(), 1.0))
    assert first.stats == second.stats
    for (n, a), (_, b) in zip(first.module.named_parameters(), second.module.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    gap = max(
        (a - b).abs().max() for a, b in zip(first.module.parameters(), weights_only.module.parameters(), strict=True)
    )
    assert gap > 1e-5  # without the saved Adam moments and lr schedule the step differs


def test_triton_loss_path_matches_the_torch_reference_in_the_learner(tiny_model_dir):
    """learner.loss_impl=triton (interpreter on CPU) computes the same log-probs and gradients.
    (Compared before Adam: its first step is ~lr * sign(g), which amplifies rounding near g = 0.)"""
    from pc_megatron.algo import LossConfig

    tokens = torch.randint(2, 23, (3, 7), generator=torch.Generator().manual_seed(4))
    batch = TokenBatch(tokens, torch.ones(3, 6))
    learners = {impl: Learner(tiny_model_dir, LearnerConfig(loss_impl=impl), seed=0) for impl in ("torch", "triton")}
    old = {impl: lrn.logprobs(batch, 0.9) for impl, lrn in learners.items()}
    assert torch.allclose(old["torch"], old["triton"], atol=1e-5)
    adv = torch.tensor([1.0, -0.5, 0.3])
    for lrn in learners.values():
        lrn.train_rl(batch, old["torch"], adv, LossConfig(), 0.9)
    grads = {impl: {n: p.main_grad for n, p in lrn.module.named_parameters()} for impl, lrn in learners.items()}
    for name, g in grads["torch"].items():
        assert g.abs().max() > 0 and torch.allclose(g, grads["triton"][name], rtol=1e-4, atol=1e-7), name


def test_truncated_is_weights_scale_each_tokens_policy_gradient(tiny_model_dir):
    """algo.loss.tis_cap: the weight w = pi_old / pi_behaviour multiplies that token's advantage,
    so a weight that is constant along a row equals scaling the row's advantage, and w = 1 (the
    engine sampled with the learner's weights) changes nothing."""
    from pc_megatron.algo import LossConfig

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
        cfg = LossConfig(tis_cap=10.0 if w is not None else 0.0)
        behaviour = old - torch.log(w) if w is not None else None  # so that pi_old / pi_behaviour = w
        stats = lrn.train_rl(batch, old, a, cfg, 1.0, behaviour_logp=behaviour)
        if w is not None:
            assert stats["tis_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-5)
        grads[name] = {n: p.main_grad.clone() for n, p in lrn.module.named_parameters()}
    for n, g in grads["none"].items():
        # the paths round differently (by the machine's vector width): compare to each tensor's scale
        assert_close_to_scale(grads["ones"][n], g, 1e-6, n)
        assert_close_to_scale(grads["weighted"][n], grads["scaled_adv"][n], 1e-5, n)
    assert any(not torch.allclose(grads["weighted"][n], g) for n, g in grads["none"].items())


def test_learner_load_errors_name_the_file(tmp_path, tiny_model_dir):
    """The learner reads HF weights lazily (safetensors slices): a truncated file, and an index
    that names a shard the folder lacks, each fail with one clear error naming the file."""
    import json
    import shutil

    from pc_megatron.errors import ModelFileError

    broken = tmp_path / "m"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="model.safetensors: unreadable safetensors"):
        Learner(broken, LearnerConfig(), seed=0)
    (broken / "model.safetensors").write_bytes(data)
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="names shard model-00002-of-00002.safetensors, which is not in"):
        Learner(broken, LearnerConfig(), seed=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_fp8_without_a_gpu_is_one_clear_error(tiny_model_dir):
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="learner.fp8 needs a CUDA GPU with Transformer Engine"):
        Learner(tiny_model_dir, LearnerConfig(bf16=True, fp8="hybrid"), seed=0)


def test_checkpoint_with_another_optimizer_layout_is_refused(tiny_model_dir, tmp_path):
    """A plain-optimizer checkpoint does not load into a distributed-optimizer run: one error
    naming the setting, nothing changed."""
    from pc_megatron.errors import ModelFileError

    Learner(tiny_model_dir, LearnerConfig(), seed=0).save(tmp_path / "ckpt")
    learner = Learner(tiny_model_dir, LearnerConfig(distributed_optimizer=True), seed=0)
    with pytest.raises(ModelFileError, match="learner.distributed_optimizer=false, this run uses true"):
        learner.load(tmp_path / "ckpt")
    assert learner.version == 0


def test_fused_old_logprobs_give_the_separate_pass_update(tiny_model_dir):
    """algo.old_logprobs=fused: the update's own forward gives the old log-probs; the step, its
    statistics and the returned log-probs equal those of a separate forward pass first."""
    from pc_megatron.algo import LossConfig

    tokens = torch.randint(2, 23, (4, 9), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(4, 8)
    mask[1, :3] = 0
    batch = TokenBatch(tokens, mask)
    adv = torch.tensor([1.0, -0.5, 0.3, -0.8])
    cfg = LossConfig(tis_cap=2.0)
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
    assert 0 < s_sep["tis_truncated_frac"] < 1 and s_sep["grad_norm"] > 0
    for n, w in w_sep.items():
        assert torch.allclose(w, w_fused[n], rtol=1e-5, atol=1e-7), n
