"""The Ray cluster and placement (``pc_megatron/runtime/ray_cluster.py``): an engine replica never spans
nodes; engines on GPUs of their own never sleep."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pc_megatron.config import load_config


def test_broadcast_needs_runtime_ray_and_split_engines_never_sleep():
    from pc_megatron.errors import ConfigError
    from pc_megatron.rollout.config import RolloutConfig, VllmConfig
    from pc_megatron.runtime.ray_cluster import engine_config

    with pytest.raises(ConfigError, match="needs runtime=ray"):  # runtime=local: nothing to broadcast to
        load_config("tiny", ["rollout.weight_sync.transport=broadcast"])
    rc = RolloutConfig(backend="vllm", vllm=VllmConfig(sleep_level=2))
    assert engine_config(rc, "split").vllm.sleep_level == 0  # on GPUs of their own: nothing to make room for
    assert engine_config(rc, "colocated").vllm.sleep_level == 2 and rc.vllm.sleep_level == 2


def test_an_engine_replica_never_spans_nodes():
    from pc_megatron.errors import ConfigError
    from pc_megatron.runtime.ray_cluster import Bundle, replica_slices

    pg_a, pg_b = object(), object()
    bundles = [Bundle(pg_a, 0, "10.0.0.1"), Bundle(pg_a, 1, "10.0.0.1"), Bundle(pg_b, 0, "10.0.0.2")]
    assert [[b.index for b in r] for r in replica_slices(bundles, 3, 1)] == [[0], [1], [0]]
    assert [[b.node for b in r] for r in replica_slices(bundles, 1, 2)] == [["10.0.0.1", "10.0.0.1"]]
    three_per_node = [Bundle(pg, i, node) for pg, node in ((pg_a, "10.0.0.1"), (pg_b, "10.0.0.2")) for i in range(3)]
    with pytest.raises(ConfigError, match=r"engine replica 1 \(tensor_parallel_size=2\) would span nodes"):
        replica_slices(three_per_node, 3, 2)


def test_secrets_never_travel_in_rays_runtime_environment():
    """Ray stores and shows the runtime environment: settings go, credentials do not."""
    from pc_megatron.runtime.ray_cluster import forwarded_env

    environ = {
        "HF_HOME": "/cache/hf",
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": "hf_x",
        "HUGGING_FACE_HUB_TOKEN": "hf_y",
        "VLLM_API_KEY": "k",
        "VLLM_USE_V1": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "RAY_AUTH_TOKEN": "t",
        "PC_MEGATRON_CACHE": "/c",
        "AWS_SECRET_ACCESS_KEY": "s",
        "WANDB_API_KEY": "w",
    }
    assert forwarded_env(environ) == {
        "HF_HOME": "/cache/hf",
        "HF_HUB_OFFLINE": "1",
        "VLLM_USE_V1": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "PC_MEGATRON_CACHE": "/c",
        "NCCL_NVLS_ENABLE": "0",  # off unless the user says otherwise
    }
    assert forwarded_env({"NCCL_NVLS_ENABLE": "1"}) == {"NCCL_NVLS_ENABLE": "1"}  # the user's own wins


def test_joining_a_cluster_without_its_token_is_one_clear_error_and_a_local_run_makes_its_own(tmp_path, monkeypatch):
    from pc_megatron.errors import ConfigError
    from pc_megatron.runtime.config import RayConfig
    from pc_megatron.runtime.ray_cluster import _token_auth

    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.setenv(var, "")  # recorded as they were, so what _token_auth sets is undone after the test
        monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match=r"ray.address=10.0.0.1:6379: .* needs the cluster's token: export RAY_"):
        _token_auth(RayConfig(address="10.0.0.1:6379"))
    assert _token_auth(RayConfig()) == "token"
    token = __import__("os").environ["RAY_AUTH_TOKEN"]
    assert len(token) == 64 and not (tmp_path / ".ray").exists()  # in the environment only, never under $HOME
    assert _token_auth(RayConfig(address="10.0.0.1:6379")) == "token"  # now it has one to offer


def test_rays_session_folder_under_tmp_must_be_this_users_alone(tmp_path):
    from pc_megatron.errors import ConfigError
    from pc_megatron.runtime.ray_cluster import _check_own_folder

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    _check_own_folder(mine)
    mine.chmod(0o777)  # made beforehand by someone else, or left open: refused
    with pytest.raises(ConfigError, match=r"is not a folder of this user's .* mode drwxrwxrwx.*ray.temp_dir"):
        _check_own_folder(mine)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="not a folder of this user's"):
        _check_own_folder(link)


def test_a_resumed_run_reuses_its_short_ray_folder_that_ray_opened_to_all(tmp_path):
    """Ray sets its session folder to 0777; it lives inside a 0700 folder of ours, so the resume of a
    run with a long path finds its own folder again (it was refused once: the check saw Ray's 0777)."""
    from pc_megatron.runtime.config import RayConfig
    from pc_megatron.runtime.ray_cluster import _temp_dir

    run_dir = tmp_path / ("a-long-run-folder-name-" * 3) / "run"
    first = Path(_temp_dir(RayConfig(), run_dir))
    try:
        first.chmod(0o777)  # what ray.init does to it
        assert Path(_temp_dir(RayConfig(), run_dir)) == first and (run_dir / "ray").resolve() == first
        assert first.parent.stat().st_mode & 0o777 == 0o700
    finally:
        import shutil

        shutil.rmtree(first.parent, ignore_errors=True)


def test_rays_folder_is_inside_a_private_folder_even_on_a_short_run_path():
    """On a short run path Ray's folder sat in the run folder itself, which others may enter: Ray opens its
    session folder to all (0777), so another local user could swap its sockets. It is always inside a 0700
    folder of this user's; one that others may enter is refused in one line."""
    import shutil
    import tempfile

    from pc_megatron.errors import ConfigError
    from pc_megatron.runtime.config import RayConfig
    from pc_megatron.runtime.ray_cluster import _temp_dir

    short = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # a run path short enough for Ray's sockets
    short.chmod(0o755)
    ray_dir = Path(_temp_dir(RayConfig(), short))
    assert len(str(ray_dir)) <= 60
    walls = [p for p in ray_dir.parents if p.stat().st_mode & 0o077 == 0 and p.stat().st_uid == os.getuid()]
    assert walls and walls[0].is_relative_to(short)  # beside the run, not under /tmp
    ray_dir.chmod(0o777)  # what ray.init does to it
    assert Path(_temp_dir(RayConfig(), short)) == ray_dir  # the resume finds it again
    walls[0].chmod(0o755)
    try:
        with pytest.raises(ConfigError, match="only this user may enter"):
            _temp_dir(RayConfig(), short)
    finally:
        shutil.rmtree(short, ignore_errors=True)
