"""Architectures read from HF configs (``pc_megatron/model/arch.py``): an unsupported option is named, and
Llama 3's RoPE scaling is read from either spelling."""

import pytest

from pc_megatron.errors import ModelFileError
from pc_megatron.model.arch import arch_from_hf_config
from tests.hf_models import CONFIGS, LLAMA3_ROPE


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": ["MistralForCausalLM"]}, "architecture 'MistralForCausalLM' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' (only silu)"),
        ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
        (
            {"rope_parameters": {**LLAMA3_ROPE, "original_max_position_embeddings": 4096}},
            "original_max_position_embeddings=4096 is not supported",
        ),
    ],
)
def test_unsupported_options_fail_naming_them(change, message):
    cfg = {**CONFIGS["llama3"]().to_dict(), "architectures": ["LlamaForCausalLM"], **change}
    with pytest.raises(ModelFileError) as e:
        arch_from_hf_config(cfg, "model/config.json")
    assert message in str(e.value) and "model/config.json" in str(e.value)


def test_llama3_rope_scaling_is_read_from_either_spelling():
    base = {**CONFIGS["llama3"]().to_dict(), "architectures": ["LlamaForCausalLM"]}
    base.pop("rope_parameters", None)
    old = arch_from_hf_config({**base, "rope_theta": 500000.0, "rope_scaling": {**LLAMA3_ROPE, "factor": 32.0}})
    new = arch_from_hf_config({**base, "rope_parameters": {**LLAMA3_ROPE, "factor": 32.0, "rope_theta": 500000.0}})
    assert old == new and old.rope_scaling_factor == 32.0 and old.rope_theta == 500000.0
