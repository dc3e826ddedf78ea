"""What a run takes of the machine (``pc_megatron/runtime/resources.py``): each process's threads from
the placement, and ``learner.bf16: auto``, resolved when the run starts and recorded with it."""

import pytest

from pc_megatron.config import load_config
from pc_megatron.runtime.resources import plan_threads, resolve_run
from tests.settings import SMALL

FOUR = [0, 1, 2, 3]


def _plan(*overrides, cores=FOUR):
    return plan_threads(load_config("tiny", list(overrides)), cores)


def test_the_synchronous_loop_gives_every_core_to_whichever_process_computes():
    plan = _plan("rollout.backend=vllm")
    assert (plan.learner, plan.engine, plan.concurrent) == (4, 4, False)
    assert plan.engine_cores == (0, 1, 2, 3) and not plan.oversubscribed


def test_one_step_off_splits_the_cores_and_binds_the_engine_apart_from_the_learner():
    plan = _plan("rollout.backend=vllm", "rollout.max_staleness=1")
    assert (plan.learner, plan.engine, plan.concurrent) == (2, 2, True)
    assert plan.engine_cores == (2, 3)  # the last cores; the learner's threads take the first ones
    split = _plan("runtime=ray", "ray.placement=split", "rollout.backend=vllm", "rollout.max_staleness=1")
    assert (split.learner, split.engine) == (2, 2)
    two_replicas = _plan(
        "runtime=ray", "ray.placement=split", "rollout.backend=vllm", "rollout.max_staleness=1", "rollout.replicas=2"
    )
    assert (two_replicas.learner, two_replicas.engine, two_replicas.engine_cores) == (1, 1, (2, 3))


def test_the_cores_counted_are_the_affinity_mask_not_the_machine():
    plan = plan_threads(load_config("tiny", ["rollout.max_staleness=1"]), cores=[5])
    assert (plan.cores, plan.learner, plan.engine) == (1, 1, 1)


def test_a_joined_cluster_gives_each_actor_its_bundles_cpus():
    plan = _plan("runtime=ray", "ray.address=10.0.0.1:6379", "ray.cpus_per_bundle=6", "rollout.backend=vllm")
    assert (plan.learner, plan.engine, plan.engine_cores) == (6, 6, ())


def test_an_explicit_setting_is_kept_and_an_oversubscribing_one_is_one_warning():
    kept = _plan("threads=1", "rollout.max_staleness=1", cores=[0, 1])
    assert (kept.learner, kept.engine) == (1, 1) and not kept.oversubscribed  # it reaches the engine too
    over = _plan("threads=2", "rollout.max_staleness=1", "rollout.backend=vllm", cores=[0, 1])
    assert (over.learner, over.engine) == (2, 2)
    assert "oversubscribed" in over.oversubscribed and "threads=auto" in over.oversubscribed
    assert "\n" not in over.oversubscribed
    mixed = _plan("threads=1", "rollout.threads=3", cores=[0, 1, 2])
    assert (mixed.learner, mixed.engine) == (1, 3) and not mixed.oversubscribed  # they take turns


def test_bad_thread_settings_name_the_key():
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="threads: 'many' is not a positive integer or auto"):
        load_config("tiny", ["threads=many"])
    with pytest.raises(ConfigError, match="rollout.threads: '0' is not a positive integer or auto"):
        load_config("tiny", ["rollout.threads=0"])
    with pytest.raises(ConfigError, match="learner.bf16: 'maybe' is not one of true, false, auto"):
        load_config("tiny", ["learner.bf16=maybe"])


def test_resolving_a_concrete_config_changes_nothing(monkeypatch):
    from pc_megatron.learner import precision

    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: [])
    concrete = ["learner.distributed_timeout_s=2400", "rollout.vllm.gpu_memory_utilization=0.5"]
    cfg = load_config("tiny", ["threads=2", "rollout.threads=2", "learner.bf16=false", *concrete])
    assert resolve_run(cfg, cores=FOUR)[0] == cfg
    auto = load_config("tiny", ["learner.bf16=auto"])
    resolved, why = resolve_run(auto, cores=FOUR)
    assert (resolved.learner.bf16, resolved.threads, resolved.rollout.threads) == (False, 4, 4)
    # the collective deadline above the engines' (rollout.timeout_s + 600), the engine's share by placement
    assert resolved.learner.distributed_timeout_s == auto.rollout.timeout_s + 600
    assert resolved.rollout.vllm.gpu_memory_utilization == 0.5
    split = load_config("tiny", ["runtime=ray", "ray.placement=split"])
    assert resolve_run(split, cores=FOUR)[0].rollout.vllm.gpu_memory_utilization == 0.9
    assert "fp32" in why.lines()[0]


def test_the_run_records_what_auto_became_and_a_resume_that_resolves_otherwise_is_refused(
    cache_dir, tmp_path, monkeypatch
):
    """A run started with learner.bf16=auto where it resolved to bf16: config.yaml's first line says so
    and keeps `auto`; resumed where auto would give fp32, the run is refused in one line before it
    changes anything (continuing in another precision would not be the same run)."""
    from pc_megatron.errors import ConfigError
    from pc_megatron.learner import precision
    from pc_megatron.train import train

    monkeypatch.setenv("PC_MEGATRON_CACHE", str(cache_dir))
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ["avx512_bf16"])
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda threads: 4.0)
    run_dir = tmp_path / "auto"
    cfg = load_config("tiny", [*SMALL, "steps=1", "checkpoint.every_steps=1", "learner.bf16=auto"])
    train(cfg, run_dir)
    text = (run_dir / "config.yaml").read_text()
    first = text.splitlines()[0]
    assert first.startswith("# resolved when the run started, on this machine: learner.bf16=auto -> true")
    assert "  bf16: auto\n" in text
    saved = load_config(str(run_dir / "config.yaml"), ["steps=2"])
    assert saved.learner.bf16 == "auto"
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: [])
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match=r"learner.bf16: True -> False"):
        train(saved, run_dir, resume=True)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
