"""The wire types (``pc_megatron/batch.py``): a token batch's row lengths, completions laid out as a
training batch with their log-probs, group statistics."""

import pytest
import torch

from pc_megatron.batch import TokenBatch, completions_to_batch, group_stats
from pc_megatron.rollout.config import SamplingParams
from pc_megatron.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(tiny_model_dir, max_batch_size=5)


PROMPTS = [[3, 4, 12, 5, 16], [7, 16], [3, 3, 3, 3, 3, 3, 16]]  # different lengths: left padding matters


def test_a_token_batch_knows_its_rows_lengths():
    tokens = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    assert TokenBatch(tokens, mask).lengths() == [4, 6, 6]  # last trained target + 1; untrained: all


def test_completions_to_batch_aligns_masks_and_logprobs(engine):
    cs = engine.generate(PROMPTS, 2, SamplingParams(temperature=1.0, max_new_tokens=5), seed=4)
    batch, elp = completions_to_batch([PROMPTS[c.prompt_index] for c in cs], cs, pad_id=0)
    for i, c in enumerate(cs):
        start = len(PROMPTS[c.prompt_index]) - 1
        assert batch.loss_mask[i].sum() == len(c.token_ids)
        assert batch.tokens[i, start + 1 : start + 1 + len(c.token_ids)].tolist() == c.token_ids
        assert elp[i, start : start + len(c.token_ids)].tolist() == pytest.approx(c.logprobs)


def test_group_stats_count_degenerate_groups():
    correct = torch.tensor([1, 1, 0, 0, 0, 0, 1, 0], dtype=torch.bool)
    s = group_stats(correct, correct.float(), group_size=2)
    assert s["frac_all_correct"] == 0.25 and s["frac_all_wrong"] == 0.5 and s["mean_group_std"] == 0.125
