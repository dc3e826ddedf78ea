"""The Megatron <-> Hugging Face name mapping (``pc_megatron/weight_sync/mapping.py``): HF -> Megatron -> HF
is bit-identical."""

import torch

from pc_megatron.learner.export import load_hf_weights


def test_hf_to_megatron_to_hf_is_bit_identical(tiny_model_dir, learner):
    hf = load_hf_weights(tiny_model_dir)
    back = dict(learner.hf_named_tensors())
    assert set(back) == set(hf) - {"lm_head.weight"}  # tied: lm_head is embed_tokens
    for name, t in back.items():
        assert torch.equal(t.cpu(), hf[name]), name
