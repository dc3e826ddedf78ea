"""End to end on the tiny model: GRPO steps, metrics contract, exact resume after SIGKILL, and a clean
stop on SIGTERM (checkpoint, no process left, resume reproduces the run)."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pc_megatron.config import load_config
from pc_megatron.observability import read_metrics
from pc_megatron.train import train
from tests.settings import SMALL, comparable


@pytest.fixture(scope="module")
def two_step_run(cache_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "two"
    summary = train(load_config("tiny", [*SMALL, "steps=2"]), run_dir)
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


def test_phase_times_add_up_to_the_step_time(two_step_run):
    """Phases are exclusive (the scheduler's own time leaves out the fleet and reward calls it
    makes), so the breakdown accounts for the step."""
    for row in read_metrics(two_step_run[0])[1:]:
        phases = sum(v for k, v in row.items() if k.startswith("time_") and k != "time_step_s")
        assert 0.95 * row["time_step_s"] <= phases <= row["time_step_s"], row


def test_learner_and_engine_logprobs_agree_every_step(two_step_run):
    """Weight sync is exact: in fp32 the learner reproduces the engine's sampling log-probs."""
    for row in read_metrics(two_step_run[0])[1:]:
        assert row["logprob_mismatch_max"] < 1e-4


def run_cli(args, cache_dir, **kw):
    env = {**os.environ, "PC_MEGATRON_CACHE": str(cache_dir)}
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


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(cache_dir, tmp_path, uninterrupted):
    full = uninterrupted
    common = [*INTERRUPTED, f"out_dir={tmp_path}"]
    proc = run_cli([*common, "name=killed"], cache_dir, start_new_session=True)
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

    assert run_cli(["--resume", str(tmp_path / "killed")], cache_dir).wait(timeout=600) == 0
    resumed = read_metrics(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for a, b in zip(full, resumed, strict=True):
        assert comparable(a) == comparable(b), f"step {a['step']} differs"
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["cum_rollouts"] == 6 * 8 * 4


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
        *(["algo.loss.tis_cap=2.0"] if policy == "pilot_commit" else []),
    ]
    full = train(load_config("tiny", [*common, "steps=4"]), tmp_path / "full")
    rows = read_metrics(tmp_path / "full")
    assert full["cum_rollouts"] == rows[-1]["sched/cum_generated"] > 0
    assert full["cum_generated_tokens"] == rows[-1]["sched/cum_tokens_generated"] > 0
    assert all(r["sched/groups"] <= 8 for r in rows[1:])
    if policy == "pilot_commit":
        assert rows[-1]["sched/cum_generated_pilot"] > 0 and rows[-1]["sched/cum_generated_commit"] > 0
        # truncated IS: on-policy tokens weigh ~1, stale pilot tokens anything up to the cap
        assert all(0 < r["tis_weight_mean"] <= 2.0 for r in rows[1:])
    train(load_config("tiny", [*common, "steps=2"]), tmp_path / "cut")
    resumed_cfg = load_config(str(tmp_path / "cut" / "config.yaml"), ["steps=4"])
    train(resumed_cfg, tmp_path / "cut", resume=True)
    for a, b in zip(rows, read_metrics(tmp_path / "cut"), strict=True):
        assert comparable(a) == comparable(b), f"step {a['step']} differs"


def test_compare_runs_every_method_at_every_seed_and_reports_intervals(cache_dir, tmp_path):
    from pc_megatron.commands.compare import compare

    over = [*SMALL, "steps=2", "scheduler.p_lower=0.0", "data.synthetic.num_eval_expected=200"]
    dead = tmp_path / "cmp" / "seed1" / "pilot_commit"  # a run killed while writing its first checkpoint
    (dead / "checkpoints" / "step_000002.tmp").mkdir(parents=True)  # (train refuses a folder with checkpoints/)
    (dead / "config.yaml").write_text("seed: 1\n")
    own = {"pilot_commit": ["steps=3"]}  # one method's own overrides reach its runs only
    result = compare(
        "tiny", over, tmp_path / "cmp", ("grpo", "pilot_commit"), seeds=(0, 1), jobs=2, method_overrides=own
    )
    assert result["metric"] == "eval_expected_accuracy" and result["seeds"] == [0, 1]
    for s in (0, 1):
        assert read_metrics(tmp_path / "cmp" / f"seed{s}" / "grpo")[-1]["step"] == 2
        assert read_metrics(tmp_path / "cmp" / f"seed{s}" / "pilot_commit")[-1]["step"] == 3
    # the dead run was moved aside (kept, not deleted) and run again from the start
    assert [(p / "config.yaml").read_text() for p in dead.parent.glob("pilot_commit.failed-*")] == ["seed: 1\n"]
    grpo = result["methods"]["grpo"]
    seed_mean_best = max(
        sum(r["eval_expected_accuracy"] for r in rs) / 2
        for rs in zip(*(read_metrics(tmp_path / "cmp" / f"seed{s}" / "grpo") for s in (0, 1)), strict=True)
        if "eval_expected_accuracy" in rs[0]
    )
    assert result["target"] == pytest.approx(seed_mean_best)
    assert grpo["rollouts_to_target"]["reached"] in ("1/2", "2/2")  # the mean curve's best: some seed reaches it
    for m in result["methods"].values():
        assert m["auc"]["n"] == 2 and m["auc"]["ci95"][0] <= m["auc"]["mean"] <= m["auc"]["ci95"][1]
        assert set(m["per_seed"]) == {0, 1}
    assert "pilot_commit_vs_grpo" in result and "grpo_vs_pilot_commit" not in result
    pc = result["paired"]["methods"]["pilot_commit"]  # paired by seed at equal rollouts
    assert set(result["paired"]["methods"]) == {"pilot_commit"} and pc["auc_gain"]["n"] == 2
    for name in ("compare.json", "compare.md", "compare.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 100
    # finished runs are reused, not redone
    mtime = (tmp_path / "cmp" / "seed0" / "grpo" / "metrics.jsonl").stat().st_mtime
    again = compare(
        "tiny", over, tmp_path / "cmp", ("grpo", "pilot_commit"), seeds=(0, 1), jobs=2, method_overrides=own
    )
    assert again["target"] == result["target"]
    assert (tmp_path / "cmp" / "seed0" / "grpo" / "metrics.jsonl").stat().st_mtime == mtime


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
