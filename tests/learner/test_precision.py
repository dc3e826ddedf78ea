"""The learner's precision (``learner.bf16``): bf16 with fp32 main parameters and gradients on a CPU
(Megatron's mixed precision through ``compat/megatron_cpu.py``), and ``auto`` resolved by the CPU's
flags and a matmul probe (``learner/precision.py``)."""

import pytest
import torch

from pc_megatron.batch import TokenBatch
from pc_megatron.learner import precision
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner

HAS_UNITS = bool(precision.cpu_bf16_units()) and not torch.cuda.is_available()


@pytest.mark.skipif(not HAS_UNITS, reason="a CPU with bf16 matrix instructions (amx_bf16 / avx512_bf16)")
def test_auto_resolves_to_bf16_on_a_cpu_with_bf16_units():
    bf16, why = precision.resolve_bf16("auto", threads=torch.get_num_threads())
    assert bf16, why
    assert precision.bf16_matmul_speedup(torch.get_num_threads()) >= precision.BF16_MIN_SPEEDUP
    assert any(unit in why for unit in precision.BF16_UNITS)


def test_auto_falls_back_to_fp32_without_units_or_without_a_measured_gain(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: [])
    bf16, why = precision.resolve_bf16("auto", threads=1)
    assert not bf16 and "no bf16 matrix instructions" in why
    # the flag without the speed (an emulating hypervisor, a throttled core): the probe decides
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ["avx512_bf16"])
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda threads: 0.6)
    bf16, why = precision.resolve_bf16("auto", threads=1)
    assert not bf16 and "0.6x fp32 < 1.5x" in why
    assert precision.resolve_bf16(True, threads=1) == (True, "set")  # an explicit setting is kept


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert precision.cpu_bf16_units(info) == ["amx_bf16", "avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert precision.cpu_bf16_units(info) == []
    assert precision.cpu_bf16_units(tmp_path / "missing") == []


def test_bf16_learner_keeps_fp32_main_parameters_and_follows_fp32(tiny_model_dir):
    """On a CPU the bf16 learner's model is bf16 throughout (norms included), its optimizer steps fp32
    main copies, and three steps land within bf16's precision of the fp32 learner's."""
    from pc_megatron.algo.config import LossConfig

    tokens = torch.randint(2, 23, (8, 12), generator=torch.Generator().manual_seed(1))
    batch = TokenBatch(tokens, torch.ones(8, 11))
    adv = torch.linspace(-1, 1, 8)
    learners = {}
    for bf16 in (False, True):
        learner = Learner(tiny_model_dir, LearnerConfig(bf16=bf16, lr=1e-3, clip_grad=0.0), seed=0)
        for _ in range(3):
            learner.train_rl(batch, learner.logprobs(batch), adv, LossConfig(correction="none"), 1.0)
        learners[bf16] = learner
    half = learners[True]
    assert set(half.param_dtypes()) == {"torch.bfloat16"}
    mains = [p for group in half.optimizer.param_groups for p in group["params"]]
    assert mains and all(p.dtype == torch.float32 for p in mains)
    assert half.version == 3
    start = dict(Learner(tiny_model_dir, LearnerConfig(), seed=0).hf_named_tensors())
    names = sorted(start)

    def moved(learner):  # every weight's change over the three steps, as one vector
        weights = dict(learner.hf_named_tensors())
        return torch.cat([(weights[n].float() - start[n].float()).flatten() for n in names])

    full, mixed = moved(learners[False]), moved(learners[True])
    assert full.norm() > 0.1  # the steps moved the weights: the comparison is not vacuous
    assert torch.nn.functional.cosine_similarity(full, mixed, dim=0) > 0.98
    assert (mixed - full).norm() / full.norm() < 0.15


def test_only_trained_positions_reach_the_output_layer_and_their_logprobs_are_the_full_logits(tiny_model_dir):
    """The learner's log-probs come from an output layer that sees only the positions a loss reads (a
    row with nothing trained: all of it); at those positions they equal the log-softmax of the whole
    logits, and every other position is 0."""
    learner = Learner(tiny_model_dir, LearnerConfig(micro_batch_size=2, max_tokens_per_micro_batch=0), seed=0)
    tokens = torch.randint(2, 23, (3, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(3, 9)
    mask[0, 4:9] = 1
    mask[1, 6:8] = 1  # row 2 trains nothing: every position is scored
    rows_seen = []
    hook = learner.module.output_layer.register_forward_hook(lambda m, a, out: rows_seen.append(out[0].shape[0]))
    logp = learner.logprobs(TokenBatch(tokens, mask))
    hook.remove()
    assert sum(rows_seen) == 5 + 2 + 9  # not 3 x 10
    full = torch.log_softmax(learner.forward_logits(tokens).double(), -1)[:, :-1]
    want = full.gather(-1, tokens[:, 1:, None]).squeeze(-1).float()
    scored = mask != 0
    scored[2] = True
    assert torch.allclose(logp[scored], want[scored], atol=1e-5)
    assert logp[~scored].abs().max() == 0
