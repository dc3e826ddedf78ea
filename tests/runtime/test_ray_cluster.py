"""The Ray cluster and placement (``pc_megatron/runtime/ray_cluster.py``): an engine replica never spans
nodes; engines on GPUs of their own never sleep."""

from __future__ import annotations

import pytest

from pc_megatron.config import load_config


def test_broadcast_needs_runtime_ray_and_split_engines_never_sleep():
    from pc_megatron.errors import ConfigError
    from pc_megatron.rollout.base import RolloutConfig, VllmConfig
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
