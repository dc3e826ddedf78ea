"""The HF rollout engine (``pc_megatron/rollout/hf_engine.py``): seeded sampling, greedy, stop conditions,
weight updates."""

import pytest
import torch

from pc_megatron.rollout.config import SamplingParams
from pc_megatron.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(tiny_model_dir, max_batch_size=5)


PROMPTS = [[3, 4, 12, 5, 16], [7, 16], [3, 3, 3, 3, 3, 3, 16]]  # different lengths: left padding matters


def test_same_seed_same_samples_other_seed_other_samples(engine):
    p = SamplingParams(temperature=1.0, max_new_tokens=6)
    a, b, c = (
        engine.generate(PROMPTS, 4, p, seed=1),
        engine.generate(PROMPTS, 4, p, seed=1),
        engine.generate(PROMPTS, 4, p, seed=2),
    )
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert [x.prompt_index for x in a] == [0] * 4 + [1] * 4 + [2] * 4


def test_a_sample_depends_on_its_seed_and_place_not_on_its_batch(engine):
    """Sample j of prompt i is drawn with sample_seed(seed, first_prompt + i, j): a slice of the
    request list generated alone (as a fleet replica would) gives the same completions."""
    p = SamplingParams(temperature=1.0, max_new_tokens=6)
    whole = engine.generate(PROMPTS, [3, 2, 4], p, seed=7)
    tail = engine.generate(PROMPTS[1:], [2, 4], p, seed=7, first_prompt=1)
    assert [c.token_ids for c in tail] == [c.token_ids for c in whole[3:]]
    for a, b in zip(tail, whole[3:], strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_batched_generation_equals_one_prompt_at_a_time(engine):
    """Left padding and position ids are right: a prompt's greedy output does not depend on
    the other prompts in the batch."""
    p = SamplingParams(temperature=0.0, max_new_tokens=6)
    batched = engine.generate(PROMPTS, 1, p, seed=0)
    for i, prompt in enumerate(PROMPTS):
        (alone,) = engine.generate([prompt], 1, p, seed=0)
        assert alone.token_ids == batched[i].token_ids
        assert alone.logprobs == pytest.approx(batched[i].logprobs, abs=1e-5)


def test_logprobs_are_those_of_the_full_tempered_distribution(engine, tiny_model_dir):
    p = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=4)
    (c,) = engine.generate([PROMPTS[0]], 1, p, seed=3)
    seq = torch.tensor([PROMPTS[0] + c.token_ids], device=engine.device)
    with torch.no_grad():
        logits = engine.model(input_ids=seq).logits[0, len(PROMPTS[0]) - 1 : -1].cpu() / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-5)


def test_stop_tokens_end_a_completion(engine):
    p = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=tuple(range(64)))
    for c in engine.generate(PROMPTS, 2, p, seed=0):
        assert len(c.token_ids) == 1 and c.finish_reason == "stop"
    p = SamplingParams(temperature=1.0, max_new_tokens=3)
    for c in engine.generate(PROMPTS, 2, p, seed=0):
        assert c.finish_reason == "stop" or len(c.token_ids) == 3


def test_update_weights_changes_outputs_and_checks_the_manifest(engine):
    from pc_megatron.weight_sync.manifest import WeightSyncError

    p = SamplingParams(temperature=0.0, max_new_tokens=4)
    before = engine.generate(PROMPTS, 1, p, seed=0)
    saved = {n: t.clone() for n, t in engine.model.named_parameters()}
    try:
        stats = engine.update_weights(((n, torch.randn_like(t)) for n, t in saved.items()), version=7)
        assert stats["weight_sync_bytes"] == sum(t.numel() * 4 for t in saved.values())
        after = engine.generate(PROMPTS, 1, p, seed=0)
        assert [c.logprobs for c in after] != [c.logprobs for c in before]
        assert {c.weight_version for c in after} == {7} and {c.weight_version for c in before} == {0}
        changed = {n: t.clone() for n, t in engine.model.named_parameters()}
        bad_streams = {
            "has no tensor 'model.bogus.weight'": [*saved.items(), ("model.bogus.weight", torch.zeros(1))],
            "'model.norm.weight' was never sent": [(n, t) for n, t in saved.items() if n != "model.norm.weight"],
            "'model.norm.weight' was sent twice": [*saved.items(), ("model.norm.weight", saved["model.norm.weight"])],
            "'model.norm.weight' has shape": [(n, t[:-1] if n == "model.norm.weight" else t) for n, t in saved.items()],
        }
        for message, stream in bad_streams.items():
            with pytest.raises(WeightSyncError, match=message):
                engine.update_weights(stream, version=8)
            # staged: a rejected stream changes nothing
            assert all(torch.equal(t, changed[n]) for n, t in engine.model.named_parameters())
            assert engine.weight_version == 7
    finally:
        engine.update_weights(saved.items(), version=0)


def test_prompt_logprobs_are_the_models(engine):
    lps = engine.prompt_logprobs(PROMPTS)
    for prompt, lp in zip(PROMPTS, lps, strict=True):
        ids = torch.tensor([prompt], device=engine.device)
        with torch.no_grad():
            ref = torch.log_softmax(engine.model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).cpu()
        assert lp == pytest.approx(ref.squeeze(-1).tolist(), abs=1e-6)
