"""GPU paths (marked ``gpu``; skipped on CPU): Transformer Engine layer spec, the CUDA engines,
colocated vLLM (sleep/wake, CUDA-IPC weight sync, learner offload) and the 1.5B rollout rate.

Run on a GPU machine with ``pytest -m gpu``; ``tools/device_check.sh`` runs these and every other
GPU check in one call (docs/LOG.md has what ran where, and what was skipped for want of TE/vLLM).
"""

import pytest
import torch

from pc_megatron.batch import TokenBatch, completions_to_batch, logprob_mismatch
from pc_megatron.learner import Learner, LearnerConfig
from pc_megatron.rollout.base import SamplingParams
from pc_megatron.rollout.hf_engine import HFEngine

pytestmark = pytest.mark.gpu


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
    from pc_megatron.algo import LossConfig
    from tests.workers.parallel_worker import ragged_batch

    batch, adv = ragged_batch()
    learner = Learner(folder, cfg, seed=0)
    old = learner.logprobs(batch)
    learner.train_rl(batch, old, adv, LossConfig(), 1.0)
    grads = torch.cat([p.main_grad.flatten().float() for p in learner.module.parameters()])
    return old, grads, batch


@pytest.mark.parametrize("impl", ["local", "transformer_engine"])
def test_packed_micro_batches_on_gpu_equal_the_padded_ones(tmp_path, impl):
    """A ragged batch (lengths 4-200) as fixed padded rows and as packed THD streams under a token
    budget: the same log-probs and gradients. Local spec in fp32 (the packed attention of
    learner/packed_attention.py on CUDA); TE spec in bf16 (TE's THD kernels take half precision)."""
    from tests.hf_models import make_hf_model

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


def test_fp8_on_a_ragged_packed_batch(tmp_path):
    """FP8 GEMMs need each micro-batch's tokens in multiples of 16: the planner pads the packed stream
    to that alignment; the step runs and agrees with bf16 to FP8 precision."""
    pytest.importorskip("transformer_engine")
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.model.config import TinyModelConfig

    folder = create_tiny_model(
        TinyModelConfig(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512),
        tmp_path / "m",
    )
    common = dict(transformer_impl="transformer_engine", bf16=True, max_tokens_per_micro_batch=256, clip_grad=0.0)
    bf16 = _ragged_on(folder, LearnerConfig(**common))
    fp8 = _ragged_on(folder, LearnerConfig(fp8="hybrid", **common))
    mask = bf16[2].loss_mask > 0
    assert torch.nn.functional.cosine_similarity(bf16[0][mask], fp8[0][mask], dim=0) > 0.99
    assert torch.nn.functional.cosine_similarity(bf16[1], fp8[1], dim=0) > 0.9


def test_sequence_parallel_on_a_ragged_batch(tmp_path):
    """TP 2 with sequence parallelism (TE, bf16, two GPUs) on the ragged batch, packed and padded:
    the planner aligns each micro-batch to TP; the loss matches TP 2 without it."""
    if torch.cuda.device_count() < 2:
        pytest.skip("sequence parallelism needs TP >= 2: two GPUs")
    pytest.importorskip("transformer_engine")
    import json

    from tests.hf_models import make_hf_model
    from tests.torchrun import torchrun

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


def test_bf16_learner_step_on_gpu(tiny_model_dir):
    learner = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3), seed=0)
    tokens = torch.randint(2, 23, (4, 8), generator=torch.Generator().manual_seed(0))
    batch = TokenBatch(tokens, torch.ones(4, 7))
    first = learner.train_sft(batch)["loss"]
    for _ in range(5):
        last = learner.train_sft(batch)["loss"]
    assert last < first


def test_offload_to_pinned_host_memory_frees_the_gpu_and_changes_nothing(tiny_model_dir):
    """Two bf16 learners take the same steps; one offloads its optimizer state (to pinned host
    buffers) and gradient buffers between steps. Device memory goes down while offloaded, and the
    weights after three steps are bit-identical to the learner that never offloaded."""
    from pc_megatron.algo import LossConfig

    tokens = torch.randint(2, 23, (8, 12), generator=torch.Generator().manual_seed(1)).cuda()
    batch = TokenBatch(tokens, torch.ones(8, 11, device="cuda"))
    adv = torch.linspace(-1, 1, 8, device="cuda")
    weights = {}
    for offload in (False, True):
        learner = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3, offload_during_rollout=offload), seed=0)
        for _ in range(3):
            learner.train_rl(batch, learner.logprobs(batch), adv, LossConfig(), 1.0)
            used = torch.cuda.memory_allocated()
            learner.offload()
            if offload:
                assert torch.cuda.memory_allocated() < used and learner._host.host_bytes > 0
        weights[offload] = {n: t.clone() for n, t in learner.hf_named_tensors()}
    for name, t in weights[False].items():
        assert torch.equal(t, weights[True][name]), name


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_forward_backward_close_to_bf16(tmp_path, recipe):
    """TE spec, bf16 vs bf16 + FP8 GEMMs (hybrid) on a random Qwen2 with FP8-friendly shapes:
    logits and gradients agree to FP8 precision."""
    pytest.importorskip("transformer_engine")
    from pc_megatron.algo import LossConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.model.config import TinyModelConfig

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
        learner.train_rl(batch, learner.logprobs(batch), torch.linspace(-1, 1, 8), LossConfig(), 1.0)
        grads = torch.cat([p.main_grad.flatten().float() for p in learner.module.parameters()])
        out[name] = (logits, grads)
    cos = torch.nn.functional.cosine_similarity
    assert cos(out["bf16"][0].flatten(), out["fp8"][0].flatten(), dim=0) > 0.99
    assert cos(out["bf16"][1], out["fp8"][1], dim=0) > 0.95


def _vllm_cfg(**kw):
    from pc_megatron.rollout.base import RolloutConfig, VllmConfig

    return RolloutConfig(backend="vllm", vllm=VllmConfig(gpu_memory_utilization=0.3, **kw))


def test_colocated_vllm_sleeps_wakes_and_takes_the_learners_weights_over_cuda_ipc(tmp_path):
    """One GPU shared by a bf16 learner and a vLLM engine: the engine sleeps (memory returned)
    while the learner trains with its optimizer state offloaded and back, then a CUDA-IPC sync
    wakes it with the new weights; engine log-probs match the learner's to bf16 precision."""
    pytest.importorskip("vllm")
    from pc_megatron.algo import LossConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.model.config import TinyModelConfig
    from pc_megatron.rollout.vllm_engine import VllmEngine

    folder = create_tiny_model(
        TinyModelConfig(num_layers=4, hidden_size=512, num_heads=8, num_kv_heads=2, intermediate_size=1024),
        tmp_path / "m",
    )
    learner = Learner(folder, LearnerConfig(bf16=True, lr=1e-4, offload_during_rollout=True), seed=0)
    engine = VllmEngine(folder, _vllm_cfg(), learner_bf16=True)
    assert engine.sender.kind == "cuda_ipc" and engine.sleep_level == 2
    prompts = [[3, 4, 12, 5, 16], [7, 16, 9, 9]]
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    for step in range(2):
        learner.offload()
        cs = engine.generate(prompts, 8, params, seed=step)
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        assert torch.cuda.mem_get_info()[0] > free_awake  # the engine gave memory back
        batch, elp = completions_to_batch([prompts[c.prompt_index] for c in cs], cs, pad_id=0)
        old = learner.logprobs(batch)
        _, worst = logprob_mismatch(old, elp, batch.loss_mask)
        assert worst < 0.1, f"step {step}: engine/learner log-prob gap {worst} (bf16)"
        adv = torch.linspace(-1, 1, len(cs))
        learner.train_rl(batch, old, adv, LossConfig(), 1.0)
        stats = engine.update_weights(learner.hf_named_tensors(), learner.version)
        assert engine.served_version() == learner.version and stats["weight_sync_gbps"] > 0
    engine.close()


def test_vllm_rollout_throughput_at_the_1_5b_recipe_shape(tmp_path):
    """The 1.5B recipe's engine settings on a random Qwen2.5-1.5B-shaped model: generated
    tokens per second for 64 prompts x 8 samples x 512 tokens (printed; a floor, not a target)."""
    pytest.importorskip("vllm")
    import time

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pc_megatron.embedded.tiny_model import build_tokenizer
    from pc_megatron.rollout.vllm_engine import VllmEngine

    cfg = Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=1,
    )  # fmt: skip
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "m")
    build_tokenizer().save_pretrained(tmp_path / "m")
    engine = VllmEngine(tmp_path / "m", _vllm_cfg(max_model_len=1024, max_num_seqs=512), learner_bf16=True)
    prompts = [list(range(2, 2 + 64)) for _ in range(64)]
    params = SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=())
    engine.generate(prompts[:4], 1, params, seed=0)
    t0 = time.perf_counter()
    out = engine.generate(prompts, 8, params, seed=1)
    rate = sum(len(c.token_ids) for c in out) / (time.perf_counter() - t0)
    print(f"vLLM 1.5B-shaped rollout: {rate:,.0f} generated tokens/s")
    engine.close()
    assert rate > 1000


def test_broadcast_weight_sync_over_nccl_into_another_gpu(tmp_path):
    """The broadcast transport on GPU: the sender on cuda:0 (this process), a receiver process on
    cuda:1; every bucket is one NCCL broadcast between device buffers, bit-identical on arrival."""
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL takes one process per GPU: needs 2 GPUs")
    import torch.multiprocessing as mp

    from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
    from pc_megatron.weight_sync.manifest import Manifest
    from pc_megatron.weight_sync.transport import BroadcastSender, push_weights
    from tests.test_weight_sync_broadcast import BUCKET, _Engine, _weights

    engine = _Engine(mp.get_context("spawn"), tmp_path / "engine.pt", device="cuda:1")
    try:
        torch.cuda.set_device(0)
        group = BroadcastGroup.create("127.0.0.1", receivers=1, timeout_s=120, device="cuda:0")
        assert group.info["backend"] == "nccl"
        engine.start_join(group.info, 1)
        group.connect()
        assert engine.answer() == group.key
        sender = BroadcastSender(BUCKET, group)
        for version in (1, 2):
            named = {n: t.cuda() for n, t in _weights(seed=version).items()}
            manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in named.items()})
            stats = push_weights(named.items(), manifest, sender, [engine], version)
            assert stats["weight_sync_gbps"] > 0 and sender.buffer.device.type == "cuda"
            got = torch.load(engine.out_path)
            for name, t in named.items():
                assert torch.equal(got[name], t.cpu()), name
        sender.close()
        group.close()
    finally:
        engine.stop()
