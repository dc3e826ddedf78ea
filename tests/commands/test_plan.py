"""`pc-megatron plan` (``pc_megatron/commands/plan.py``): the figures checked by hand, what cannot fit and
what to change, the distributed optimizer suggested only where it shards, a tensor-parallel size that
does not divide the model."""

from __future__ import annotations

import pytest

from pc_megatron.cli import main
from pc_megatron.commands.plan import GIB, plan
from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError


def test_the_14b_plan_by_hand():
    """Qwen3-14B: V = 151,936, h = 5,120, 40 layers, 40 query / 8 KV heads of 128, FFN 17,408,
    untied output layer. Parameters: 2 x 151,936 x 5,120 (embedding, output) + 40 x [5,120 x 5,120
    x 2 (q, o) + 5,120 x 1,024 x 2 (k, v) + 3 x 5,120 x 17,408 (MLP) + 2 x 5,120 + 2 x 128 (norms)]
    + 5,120 = 14,768,307,200. At TP 4 each GPU holds a quarter, 3.69 B: 6.9 GiB of bf16 weights,
    13.8 GiB of fp32 gradients, and 12 B a parameter of optimizer state (41.3 GiB) over DP 4 with the
    distributed optimizer, 10.3 GiB."""
    layer = 5120 * 5120 * 2 + 5120 * 1024 * 2 + 3 * 5120 * 17408 + 2 * 5120 + 2 * 128
    total = 2 * 151936 * 5120 + 40 * layer + 5120
    assert total == 14_768_307_200
    res = plan(load_config("polaris-14b"))
    assert res["parameters"] == total and res["params_per_gpu"] == total / 4
    assert res["weights"] == 2 * total / 4 and res["grads"] == 4 * total / 4
    assert res["optimizer"] == 12 * total / 4 / 4 and res["optimizer_without_distopt"] == 12 * total / 4
    assert round(res["weights"] / GIB, 1) == 6.9 and round(res["optimizer"] / GIB, 1) == 10.3


def test_the_logits_are_counted_at_the_full_vocabulary_on_every_tensor_parallel_rank():
    """The output layer gathers the logits (``parallel_output=False``): 4 x V bytes a token into the fused
    kernel, 12 x V with the torch path, whatever TP is (it was divided by TP: polaris-14b under by ~7 GiB)."""
    cfg = load_config("polaris-14b")
    base = plan(cfg)
    tokens = base["micro_batch_tokens"]
    torch_path = plan(load_config("polaris-14b", ["learner.loss_impl=torch"]))
    assert cfg.learner.tensor_parallel_size == 4
    assert torch_path["activations"] - base["activations"] == pytest.approx(8 * 151936 * tokens)  # not 8V/4
    assert round(4 * 151936 * tokens * 3 / 4 / GIB, 1) == 7.0  # what the old figure left out at 16k tokens


def test_plan_refuses_what_cannot_fit_and_says_what_to_change(capsys):
    overrides = ["learner.tensor_parallel_size=2", "learner.data_parallel_size=2", "rollout.replicas=2"]
    assert main(["plan", "polaris-14b", *overrides]) == 2
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "learner.offload_during_rollout=true" in out
    assert main(["plan", "tiny"]) == 2
    assert "the tiny CPU recipe needs no plan" in capsys.readouterr().err


def test_plan_suggests_the_distributed_optimizer_only_where_it_shards():
    from pc_megatron.commands.plan import plan

    one = plan(
        load_config("polaris-14b", ["learner.data_parallel_size=1", "learner.distributed_optimizer=false"]), gpu_gib=20
    )
    assert one["problems"] and not any("distributed_optimizer" in p for p in one["problems"])
    many = plan(load_config("polaris-14b", ["learner.distributed_optimizer=false"]), gpu_gib=20)
    assert any("distributed_optimizer=true" in p for p in many["problems"])


def test_plan_names_the_dimension_a_tensor_parallel_size_does_not_divide():
    """Qwen3-14B has 8 KV heads: TP 3 was reported as a missing weight route, never as the real reason."""
    from pc_megatron.commands.plan import plan

    with pytest.raises(ConfigError, match="tensor-parallel size 3 does not divide the model's num_key_value_heads=8"):
        plan(load_config("polaris-14b", ["learner.tensor_parallel_size=3"]))


@pytest.mark.parametrize("recipe", ["deepmath-1.5b", "polaris-4b", "polaris-8b", "polaris-14b"])
def test_plan_says_how_fp8_scaling_stays_in_step_across_data_parallel_ranks(recipe, capsys):
    assert main(["plan", recipe, "learner.fp8=hybrid"]) in (0, 2)  # a recipe may not fit as given
    out = capsys.readouterr().out
    dp = load_config(recipe).learner.data_parallel_size
    assert f"amax reduced over the {load_config(recipe).learner.tensor_parallel_size} tensor-parallel" in out
    assert f"never across the {dp} data-parallel ranks" in out
    assert out.count("learner rank") + out.count("engine") >= 2 and "no weight route" not in out
    assert main(["plan", recipe]) in (0, 2) and "FP8" not in capsys.readouterr().out  # said only with FP8


def test_plan_says_nvlink_sharp_is_off_for_the_actors_unless_set(capsys, monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    assert main(["plan", "polaris-8b"]) in (0, 2)
    assert "NCCL_NVLS_ENABLE=0 for the actors" in capsys.readouterr().out
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    assert main(["plan", "polaris-8b"]) in (0, 2)
    assert "NCCL_NVLS_ENABLE=1 (yours)" in capsys.readouterr().out


def _problems(recipe: str, overrides: list[str], gpu_gib: float) -> tuple[dict, str]:
    res = plan(load_config(recipe, overrides), gpu_gib=gpu_gib)
    return res, " | ".join(res["problems"])


def test_training_beside_a_generating_engine_counts_both_and_names_a_share_that_fits():
    """runtime=local with rollout.max_staleness=1: the learner trains while the engine on its GPU generates,
    so nothing is offloaded and generation is training's peak plus the engine's share. At 80 GiB the
    1.5B recipe (51.3 GiB of training) does not fit beside half the GPU; the refusal names the largest
    share that does (0.35 of 80 GiB beside 51.3) and that setting fits."""
    local = ["runtime=local", "rollout.max_staleness=1"]
    res, said = _problems("deepmath-1.5b", local, 80)
    assert res["gen_peak"] == pytest.approx(res["train_peak"] + 0.5 * 80 * GIB)
    assert "training beside the generating engine" in said and "gpu_memory_utilization to 0.35" in said
    res, said = _problems("deepmath-1.5b", [*local, "rollout.vllm.gpu_memory_utilization=0.35"], 80)
    assert not res["problems"] and res["peak"] <= 80 * GIB
    synchronous, said = _problems("deepmath-1.5b", ["runtime=local"], 80)
    assert not said and synchronous["gen_peak"] < res["gen_peak"]  # η = 0 sleeps the engine while training


def test_split_engines_hold_no_learner_memory_and_take_most_of_their_gpus():
    """ray.placement=split: the engines' GPUs hold no learner state (colocated, polaris-8b at 40 GiB with a
    4,096-token budget does not fit generation beside the resident learner) and the engines take 0.9 of
    their GPUs by default; a learner that does not fit its own GPU is still refused."""
    budget = ["learner.max_tokens_per_micro_batch=1024", "rollout.max_new_tokens=512", "data.max_prompt_tokens=512"]
    colocated, said = _problems("polaris-8b", budget, 40)
    assert "generation needs" in said
    split, said = _problems("polaris-8b", [*budget, "ray.placement=split"], 40)
    assert split["gen_peak"] == pytest.approx(0.9 * 40 * GIB) and "generation" not in said
    assert split["train_peak"] == colocated["train_peak"] and not split["problems"], said
    _, said = _problems("polaris-8b", [*budget, "ray.placement=split"], 20)
    assert said.startswith("training needs")


def test_a_checkpoint_with_offload_counts_the_state_brought_back_beside_the_engine():
    """learner.offload_during_rollout: a checkpoint brings the optimizer state back to the GPU while the engine
    holds its weights (Learner.save offloads it again before the next rollout). polaris-14b with a 4,096-token
    budget and an engine of TP 1 (27.5 GiB of weights) trains and generates within 60 GiB, but its checkpoint
    needs 58.5: at 55 GiB only the checkpoint is refused, and with the engine at TP 2 it fits."""
    over = [
        "learner.offload_during_rollout=true",
        "learner.max_tokens_per_micro_batch=4096",
        "rollout.max_new_tokens=1024",
        "data.max_prompt_tokens=512",
        "rollout.vllm.gpu_memory_utilization=0.9",
    ]
    res, said = _problems("polaris-14b", [*over, "rollout.vllm.tensor_parallel_size=1"], 55)
    assert res["ckpt_peak"] == pytest.approx(res["weights"] + res["grads"] + res["optimizer"] + res["engine_weights"])
    assert res["train_peak"] < 55 * GIB and res["gen_peak"] < 55 * GIB
    assert said.startswith("a checkpoint brings the learner's state back") and "tensor_parallel_size" in said
    res, said = _problems("polaris-14b", [*over, "rollout.vllm.tensor_parallel_size=2"], 55)
    assert not said and res["ckpt_peak"] < 55 * GIB
