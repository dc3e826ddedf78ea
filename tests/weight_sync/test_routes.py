"""Weight routes (``pc_megatron/weight_sync/routes.py``; pure): which learner rank sends to which engine
worker, over what, for every layout a recipe can have; and that every shipped recipe has one."""

import pytest

from pc_megatron.config import RECIPE_DIR, load_config
from pc_megatron.errors import ConfigError
from pc_megatron.weight_sync.routes import Slot, layout_slots, plan_routes


def _routes(world, replicas, tp, placement, per_node=8, on_gpu=True, transport="auto"):
    learner, engines = layout_slots(world, replicas, tp, placement, per_node)
    return plan_routes(learner, engines, on_gpu=on_gpu, placement=placement, transport=transport)


def test_local_runtime_is_one_route_from_rank_zero():
    one = [Slot("here", 0)]
    assert plan_routes(one, [one], on_gpu=False, placement="colocated", runtime="local", engine="hf")[0].transport == (
        "local"
    )
    (gpu,) = plan_routes(one, [one], on_gpu=True, placement="colocated", runtime="local")
    assert (gpu.sender, gpu.transport) == (0, "cuda_ipc")
    (cpu,) = plan_routes(one, [one], on_gpu=False, placement="colocated", runtime="local")
    assert cpu.transport == "shm"
    with pytest.raises(ConfigError, match="needs runtime=ray"):
        plan_routes(one, [one], on_gpu=False, placement="colocated", runtime="local", transport="broadcast")


def test_colocated_single_gpu_engines_each_receive_from_their_own_gpus_learner_rank():
    """deepmath-1.5b / polaris-4b: 8 learner ranks (DP 8), 8 replicas of one GPU: replica i's worker
    takes CUDA IPC from rank i, not all from rank 0."""
    routes = _routes(world=8, replicas=8, tp=1, placement="colocated")
    assert [(r.replica, r.worker, r.sender, r.transport) for r in routes] == [(i, 0, i, "cuda_ipc") for i in range(8)]
    assert all(r.slot.index == r.sender for r in routes)


def test_polaris_14b_two_gpu_engines_beside_tp4_dp4_on_two_nodes():
    """16 learner ranks (TP 4 x DP 4) over two nodes of 8; 8 engine replicas of 2 GPUs colocated: each
    worker receives from the learner rank on its own GPU, on its own node, and no replica spans nodes."""
    routes = _routes(world=16, replicas=8, tp=2, placement="colocated")
    assert len(routes) == 16 and {r.transport for r in routes} == {"cuda_ipc"}
    assert [r.sender for r in routes] == list(range(16))
    for r in routes:
        assert r.slot.node == f"node{r.sender // 8}"
        assert len({x.slot.node for x in routes if x.replica == r.replica}) == 1
    assert [(r.replica, r.worker) for r in routes[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_split_engines_take_a_broadcast_from_rank_zero():
    routes = _routes(world=4, replicas=2, tp=2, placement="split")
    assert [r.slot.index for r in routes] == [4, 5, 6, 7]
    assert {(r.sender, r.transport) for r in routes} == {(0, "broadcast")}
    cpu = _routes(world=2, replicas=2, tp=1, placement="split", per_node=3, on_gpu=False)
    assert [(r.slot.node, r.transport) for r in cpu] == [("node0", "shm"), ("node1", "bytes")]


def test_a_replica_that_would_straddle_nodes_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"engine replica 1 \(2 workers\) would span nodes.*bundles_per_node"):
        _routes(world=6, replicas=3, tp=2, placement="colocated", per_node=3)


def test_layouts_that_cannot_work_are_refused_with_the_reason():
    # more engine GPUs than learner ranks: on GPU a worker would have no sender on its own GPU
    with pytest.raises(ConfigError, match="no learner rank.*ray.placement=split"):
        _routes(world=2, replicas=4, tp=1, placement="colocated")
    assert [r.sender for r in _routes(world=2, replicas=4, tp=1, placement="colocated", on_gpu=False)] == [0, 1, 0, 0]
    with pytest.raises(ConfigError, match="NCCL takes one process per GPU"):
        _routes(world=2, replicas=2, tp=1, placement="colocated", transport="broadcast")
    with pytest.raises(ConfigError, match="cuda_ipc copies within one GPU"):
        _routes(world=2, replicas=2, tp=1, placement="split", transport="cuda_ipc")
    with pytest.raises(ConfigError, match="shared memory does not cross nodes"):
        _routes(world=2, replicas=2, tp=1, placement="split", per_node=3, on_gpu=False, transport="shm")
    with pytest.raises(ConfigError, match="needs a GPU"):
        _routes(world=1, replicas=1, tp=1, placement="colocated", on_gpu=False, transport="cuda_ipc")
    # an explicit broadcast on CPU always sends from rank 0
    assert {r.sender for r in _routes(2, 2, 1, "colocated", on_gpu=False, transport="broadcast")} == {0}


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPE_DIR.glob("*.yaml") if p.stem != "tiny"))
def test_every_shipped_recipe_has_a_route_for_every_engine_worker(recipe):
    from pc_megatron.commands.plan import plan

    out = plan(load_config(recipe))
    assert not out["problems"], out["problems"]
    cfg = load_config(recipe)
    workers = cfg.rollout.replicas * cfg.rollout.vllm.tensor_parallel_size
    assert len(out["routes"]) == workers


def test_one_process_with_a_multi_gpu_engine_is_refused_naming_the_layout_and_the_fix():
    """runtime=local on a GPU: one CUDA IPC buffer on the learner's GPU, engine workers on others; worker 1
    would fail its GPU check at the first sync, after both models loaded. Refused before anything starts;
    on CPU the one shared-memory file reaches every worker."""
    from pc_megatron.errors import ConfigError
    from pc_megatron.weight_sync.routes import Slot, plan_routes

    two = [[Slot("local", 0), Slot("local", 1)]]
    kw = {"placement": "colocated", "runtime": "local", "engine": "vllm"}
    with pytest.raises(ConfigError, match=r"runtime=local with an engine of 2 GPUs .* use runtime=ray .*=1"):
        plan_routes([Slot("local", 0)], two, on_gpu=True, **kw)
    assert [r.transport for r in plan_routes([Slot("local", 0)], two, on_gpu=False, **kw)] == ["shm"]
    assert [r.transport for r in plan_routes([Slot("local", 0)], [two[0][:1]], on_gpu=True, **kw)] == ["cuda_ipc"]


def test_cuda_ipc_routes_follow_the_physical_gpu_not_the_bundle_index():
    """Ray gave the bundles GPUs in another order than their indices (bundle 0 on GPU-c, ...), and vLLM
    puts worker w of a replica on the w-th smallest GPU id: each worker is matched to the learner rank
    that reports the same GPU. A worker on a GPU of no learner rank is one error naming it."""
    import random

    from pc_megatron.weight_sync.routes import match_by_gpu

    learner, replicas = layout_slots(8, 4, 2, "colocated", 8, 1)
    routes = plan_routes(learner, replicas, on_gpu=True, placement="colocated")
    gpus = [f"GPU-{c}" for c in "abcdefgh"]
    rng = random.Random(3)
    learner_gpus = rng.sample(gpus, 8)  # rank r's bundle landed on this physical GPU
    on_bundle = {s.index: learner_gpus[r] for r, s in enumerate(learner)}
    worker_gpus = [sorted(on_bundle[s.index] for s in workers) for workers in replicas]  # vLLM's order
    matched = match_by_gpu(routes, learner_gpus, worker_gpus)
    assert all(learner_gpus[r.sender] == worker_gpus[r.replica][r.worker] == r.gpu for r in matched)
    assert matched[0].as_dict()["gpu"] == matched[0].gpu and f"GPU {matched[0].gpu})" in matched[0].describe()
    assert "gpu" not in routes[0].as_dict()  # unmatched (CPU, or before the actors report): no GPU to record
    assert [r.sender for r in matched] != [r.sender for r in routes]  # the index order would have been wrong here
    with pytest.raises(ConfigError, match=r"engine replica 0 worker 0 runs on GPU GPU-z, where no learner rank runs"):
        match_by_gpu(routes, learner_gpus, [["GPU-z", *w[1:]] if k == 0 else w for k, w in enumerate(worker_gpus)])
