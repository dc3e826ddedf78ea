"""The Megatron name table and its shards (``pc_megatron/weight_sync/sharding.py``): the table names the
model's parameters, and the Transformer Engine spec's table reads every HF tensor and maps back exactly."""

import torch

from pc_megatron.checkpoint.convert import megatron_param_names
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner
from pc_megatron.model.arch import load_arch


def test_param_names_match_the_megatron_model(hf_model):
    learner = Learner(hf_model, LearnerConfig(), seed=0)
    assert megatron_param_names(load_arch(hf_model)) == [n for n, _ in learner.module.named_parameters()]


def test_transformer_engine_names_map_to_the_same_hf_tensors(hf_model):
    """The TE layer spec fuses the pre-attention / pre-MLP norms into the next linear; its name
    table (walked by weight export at PP>1 and by convert on TE checkpoints) must read every HF
    tensor and map back to the HF folder exactly, with the same pipeline stages as the local one."""
    from pc_megatron.weight_sync.mapping import megatron_to_hf
    from pc_megatron.weight_sync.sharding import HFTensors, megatron_shard_from_hf, pipeline_stage

    arch = load_arch(hf_model)
    local, te = megatron_param_names(arch, "local"), megatron_param_names(arch, "transformer_engine")
    assert not [n for n in te if n.endswith(("input_layernorm.weight", "pre_mlp_layernorm.weight"))]
    assert len(set(te)) == len(te) == len(local)
    assert [pipeline_stage(n, arch, 2) for n in te] == [pipeline_stage(n, arch, 2) for n in local]
    hf = HFTensors(hf_model)
    back = dict(megatron_to_hf({n: megatron_shard_from_hf(n, hf, arch, 0, 1) for n in te}, arch))
    assert sorted(back) == sorted(hf.where)
    assert all(torch.equal(back[k], hf.read(k)) for k in back)
