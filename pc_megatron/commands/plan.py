"""``pc-megatron plan RECIPE``: per-GPU memory and per-step work of a recipe, before any GPU is
touched, and a refusal (exit 2) when it cannot fit.

The model's shape comes from ``model.path/config.json``, or, where the weights are not on this
machine, from the card of the same name in ``pc_megatron/assets/arch``. The estimates, per GPU of
a colocated run (learner rank i and an engine worker share GPU i):

- parameters of the largest pipeline stage over the tensor-parallel size, in bf16 (2 B each);
  gradients in the fp32 buffer Megatron-Core reduces in (4 B); optimizer state as Adam keeps it
  in mixed precision: fp32 master weights, first and second moments (12 B), divided by the
  data-parallel size with ``learner.distributed_optimizer``;
- activations of one micro-batch kept for the backward pass (bf16, no recomputation, fused
  attention that saves its output and not the score matrix), per layer and per token
  ``2 * (4h + q + 2kv + q + 3 * ffn)`` bytes, the head and FFN terms split over TP, the ``h``
  terms too with sequence parallelism; times the micro-batches in flight on the first pipeline
  stage (1F1B: up to PP); plus the logits and their gradient (bf16, ``4 * V`` bytes per token, into
  the fused log-prob kernel; ``12 * V`` with ``learner.loss_impl=torch``): the output layer gathers
  the full vocabulary on every tensor-parallel rank (``parallel_output=False``), so TP does not divide them. A
  micro-batch holds ``learner.max_tokens_per_micro_batch`` positions (or, with fixed rows,
  ``micro_batch_size`` longest sequences), and at least one longest sequence (a longer row runs
  alone); the largest budget that fits is reported beside it;
- the engine: ``rollout.vllm.gpu_memory_utilization`` of the GPU while it generates (its weights,
  ``2 * params / engine TP``, and the KV cache in the rest); asleep while the learner trains.

Peak = the largest of training (learner state + activations), generation (learner state left
resident unless ``learner.offload_during_rollout``, plus the engine's share) and a checkpoint (the
learner's state back beside the engine's weights). With ``rollout.max_staleness >= 1`` on shared GPUs
the learner trains while the engine generates: generation is training's peak plus the engine's share.
With ``ray.placement=split`` each GPU holds one of them, and the engine's share defaults to 0.9
(``rollout.vllm.memory_share``).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides
from pc_megatron.errors import ConfigError
from pc_megatron.model.arch import ArchSpec, arch_from_file, load_arch
from pc_megatron.model.config import ModelConfig
from pc_megatron.weight_sync.routes import Slot, layout_slots, plan_routes

if TYPE_CHECKING:
    from pc_megatron.config import RunConfig

CARDS = Path(__file__).resolve().parent.parent / "assets" / "arch"
GIB = 2**30


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="per-GPU memory and per-step work of a recipe; refuses what cannot fit")
    add_recipe_arguments(p)
    p.add_argument("--gpu-gib", type=float, default=140.0, help="memory of one GPU (H200: 140 GiB)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config

    res = plan(load_config(*recipe_and_overrides(args)), gpu_gib=args.gpu_gib)
    print(format_plan(res))
    return 2 if res["problems"] else 0


def model_arch(model: ModelConfig) -> tuple[ArchSpec, str]:
    path = model.path or model.fixture  # a fixture's card is named after it
    if not path:
        raise ConfigError("plan is for recipes with model.path or model.fixture; the tiny CPU recipe needs no plan")
    if (Path(path) / "config.json").is_file():
        return load_arch(path), str(Path(path) / "config.json")
    card = CARDS / f"{Path(path).name}.json"
    if card.is_file():
        return arch_from_file(card), str(card)
    known = sorted(p.stem for p in CARDS.glob("*.json"))
    raise ConfigError(f"{path}/config.json is not on this machine and there is no card for it (cards: {known})")


def param_counts(a: ArchSpec) -> dict[str, int]:
    """Parameters by part, as the HF checkpoint counts them (a tied output layer once)."""
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    attn = a.hidden_size * q + 2 * a.hidden_size * kv + q * a.hidden_size
    if a.qkv_bias:
        attn += q + 2 * kv
    if a.qk_norm:
        attn += 2 * a.head_dim
    layer = attn + 3 * a.hidden_size * a.ffn_hidden_size + 2 * a.hidden_size
    embedding = a.vocab_size * a.hidden_size
    lm_head = 0 if a.tie_word_embeddings else embedding
    total = embedding + a.num_layers * layer + a.hidden_size + lm_head
    return {"embedding": embedding, "per_layer": layer, "lm_head": lm_head, "total": total}


def placement(cfg: RunConfig, gpus_per_node: int) -> tuple[list[str], list]:
    """Where each learner rank and engine worker goes (``runtime=ray`` on nodes of
    ``ray.bundles_per_node`` or ``gpus_per_node`` GPUs; one process with ``runtime=local``) and each
    worker's weight route: (lines to print, routes). A layout without a valid route raises."""
    lc, rc = cfg.learner, cfg.rollout
    world = lc.tensor_parallel_size * lc.pipeline_parallel_size * lc.data_parallel_size
    tp = rc.vllm.tensor_parallel_size if rc.backend == "vllm" else 1
    if cfg.runtime == "local":
        learner, engines = [Slot("local", 0)], [[Slot("local", w) for w in range(tp)]]
    else:
        groups = 2 if cfg.algo.loss.kl_coef > 0 else 1
        per_node = cfg.ray.bundles_per_node or gpus_per_node
        learner, engines = layout_slots(world, rc.replicas, tp, cfg.ray.placement, per_node, groups)
    routes = plan_routes(
        learner,
        engines,
        on_gpu=True,
        placement=cfg.ray.placement,
        transport=rc.weight_sync.transport,
        runtime=cfg.runtime,
        engine=rc.backend,
    )
    nodes = sorted({s.node for s in learner} | {s.node for r in engines for s in r})
    lines = [
        f"{cfg.runtime} runtime, {cfg.ray.placement if cfg.runtime == 'ray' else 'one process'}: "
        f"{len(nodes)} node(s); learner ranks 0-{world - 1} on bundles {learner[0].index}-{learner[-1].index}; "
        f"{len(engines)} engine replica(s) of {tp} GPU(s)"
    ]
    eta = rc.max_staleness
    if eta:
        lines.append(
            f"asynchronous (rollout.max_staleness={eta}): the engines make up to {eta} batch(es) ahead while the "
            f"learner trains; a trained token is at most {eta} update(s) old (buffered pilots: up to "
            f"scheduler.max_off_steps={cfg.scheduler.max_off_steps} + 1); weight syncs wait for the generate call "
            f"in flight, every wait bounded by rollout.timeout_s={rc.timeout_s:g} s"
        )
    else:
        lines.append("synchronous (rollout.max_staleness=0): generate, train, sync in turn")
    lines += [r.describe() for r in routes]
    return lines, routes


def plan(cfg: RunConfig, gpu_gib: float = 140.0, gpus_per_node: int = 8) -> dict:
    """The figures ``pc-megatron plan`` prints (bytes are per GPU)."""
    from pc_megatron.weight_sync.sharding import check_divisible

    a, source = model_arch(cfg.model)
    lc, rc, v = cfg.learner, cfg.rollout, cfg.rollout.vllm
    tp, pp, dp = lc.tensor_parallel_size, lc.pipeline_parallel_size, lc.data_parallel_size
    check_divisible(a, tp, pp)  # a layout the model cannot take is the first thing to say
    n = param_counts(a)
    per_stage = a.num_layers // pp
    # the first stage holds the embedding; the last the output layer (a tied one keeps a copy there)
    first = n["embedding"] + per_stage * n["per_layer"]
    last = per_stage * n["per_layer"] + a.hidden_size + (n["lm_head"] or (n["embedding"] if pp > 1 else 0))
    stage = max(first, last) if pp > 1 else n["total"]
    p_gpu = stage / tp
    weights, grads = 2 * p_gpu, 4 * p_gpu
    optimizer = 12 * p_gpu / (dp if lc.distributed_optimizer else 1)
    # the longest sequence: prompt limit + response, else what the engine (or the model) allows
    limit = cfg.data.max_prompt_tokens
    seq = limit + rc.max_new_tokens if limit else (v.max_model_len or a.max_position_embeddings)
    budget = lc.max_tokens_per_micro_batch
    mb_tokens = max(budget, seq) if budget else seq * lc.micro_batch_size  # a longer row runs alone
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    h_split = tp if lc.sequence_parallel else 1
    per_token_layer = 2 * (4 * a.hidden_size / h_split + (2 * q + 2 * kv + 3 * a.ffn_hidden_size) / tp)
    step_tokens = cfg.algo.prompts_per_step * cfg.algo.samples_per_prompt * seq
    in_flight = min(pp, 1 + step_tokens // max(mb_tokens * dp, 1)) if pp > 1 else 1
    # the output layer's logits and their gradient: bf16 into the fused kernel, fp32 copies on the torch path;
    # gathered to the full vocabulary on every TP rank (parallel_output=False in learner/model.py)
    logit_bytes = (12 if lc.loss_impl == "torch" else 4) * a.vocab_size
    per_token = per_token_layer * per_stage * in_flight + logit_bytes
    activations = per_token * mb_tokens
    learner_state = weights + grads + optimizer
    train_peak = learner_state + activations
    gpu = gpu_gib * GIB
    fitting_budget = max(int((gpu - learner_state) / per_token) // 1024 * 1024, 0)
    engine_tp = v.tensor_parallel_size
    engine_weights = 2 * n["total"] / engine_tp
    split = cfg.runtime == "ray" and cfg.ray.placement == "split"  # engines on GPUs of their own
    together = rc.max_staleness >= 1 and not split  # the learner trains while its GPU's engine generates
    share = v.memory_share(split)
    engine_share = share * gpu if rc.backend == "vllm" else engine_weights
    kv_cache = engine_share - engine_weights
    kv_per_token = 2 * a.num_layers * kv * 2 / engine_tp  # k and v, bf16
    kv_needed = kv_per_token * seq
    if split:  # a learner GPU trains, an engine GPU generates: neither holds the other
        resident, gen_peak, ckpt_peak = 0.0, engine_share, learner_state
    elif together:  # awake together: nothing can be offloaded while the other works
        resident = learner_state
        gen_peak = train_peak + engine_share
        ckpt_peak = learner_state + engine_share
    else:
        resident = 0.0 if lc.offload_during_rollout else learner_state
        gen_peak = resident + engine_share
        # a checkpoint brings an offloaded optimizer state back while the engine holds its weights (its KV cache
        # asleep until the next rollout); the learner offloads it again after writing (Learner.save)
        ckpt_peak = learner_state + (engine_weights if rc.backend == "vllm" else 0.0)
    B, ns = cfg.algo.prompts_per_step, cfg.algo.samples_per_prompt
    sched = cfg.scheduler
    if sched.policy == "pilot_commit":
        per_round = sched.gen_prompts_multiplier * B * sched.pilot_samples + B * (ns - sched.pilot_samples)
        rollouts = f"{per_round:,} rollouts a round (pilots of {sched.gen_prompts_multiplier}B prompts, B commits)"
    elif sched.policy == "dapo":
        rollouts = f"{sched.gen_prompts_multiplier * B * ns:,} rollouts a round, rounds until {B} groups vary"
    else:
        rollouts = f"{B * ns:,} rollouts"
    out = {
        "model": source,
        "parameters": n["total"],
        "layout": f"TP {tp} x PP {pp} x DP {dp} = {tp * pp * dp} learner GPUs; engine TP {engine_tp}",
        "params_per_gpu": p_gpu,
        "weights": weights,
        "grads": grads,
        "optimizer": optimizer,
        "optimizer_without_distopt": 12 * p_gpu,
        "optimizer_with_distopt": 12 * p_gpu / dp,
        "activations": activations,
        "sequence": seq,
        "micro_batch_tokens": mb_tokens,
        "budget": budget,
        "fitting_budget": fitting_budget,
        "train_peak": train_peak,
        "engine_weights": engine_weights,
        "kv_cache": kv_cache,
        "kv_cache_tokens": kv_cache / kv_per_token if kv_per_token else math.inf,
        "gen_peak": gen_peak,
        "ckpt_peak": ckpt_peak,
        "peak": max(train_peak, gen_peak, ckpt_peak),
        "placement_memory": (
            f"split: learner GPUs {train_peak / GIB:.1f} GiB, engine GPUs {engine_share / GIB:.1f} GiB "
            f"(gpu_memory_utilization {share:g})"
            if split
            else f"colocated, rollout.max_staleness={rc.max_staleness}: learner and engine awake together on each GPU"
            if together
            else ""
        ),
        "gpu": gpu,
        "rollouts_per_step": rollouts,
        "trained_tokens_per_step": B * ns * seq,
        "fp8": fp8_line(lc.fp8, lc.fp8_recipe, tp, dp),
    }
    problems = []
    if train_peak > gpu:
        if not budget:
            smaller = "lower learner.micro_batch_size"
        elif fitting_budget >= seq:
            smaller = f"lower learner.max_tokens_per_micro_batch (at most {fitting_budget:,} fit)"
        else:
            smaller = f"shorten the sequences (one {seq}-token sequence alone does not fit)"
        # the distributed optimizer shards over data-parallel ranks: at DP 1 it changes nothing
        distopt = "set learner.distributed_optimizer=true, " if dp > 1 and not lc.distributed_optimizer else ""
        problems.append(
            f"training needs {train_peak / GIB:.1f} GiB per GPU of {gpu_gib:g}: raise learner.tensor_parallel_size or "
            f"pipeline_parallel_size, {distopt}or {smaller}"
        )
    # the largest engine share beside what the learner holds when the engine is awake, if it holds a sequence
    beside = train_peak if together else learner_state
    room = math.floor((gpu - beside) / gpu * 100) / 100
    fits_share = room if room * gpu >= engine_weights + kv_needed else 0.0
    lower = f"lower rollout.vllm.gpu_memory_utilization to {fits_share:.2f}" if fits_share > 0 else ""
    if together and gen_peak > gpu:
        instead = f"{lower}, or " if lower else ""
        problems.append(
            f"training beside the generating engine (rollout.max_staleness={rc.max_staleness}) needs "
            f"{gen_peak / GIB:.1f} GiB per GPU (learner {train_peak / GIB:.1f} + engine {engine_share / GIB:.1f}): "
            f"{instead}set rollout.max_staleness=0, or put the engines on GPUs of their own (runtime=ray "
            "ray.placement=split)"
        )
    elif gen_peak > gpu and not split:
        offload = "set learner.offload_during_rollout=true" if not lc.offload_during_rollout else ""
        fix = " or ".join(x for x in (offload, lower) if x) or "raise rollout.vllm.tensor_parallel_size"
        problems.append(
            f"generation needs {gen_peak / GIB:.1f} GiB per GPU (learner {resident / GIB:.1f} resident + engine "
            f"{engine_share / GIB:.1f}): {fix}"
        )
    if ckpt_peak > gpu and ckpt_peak > gen_peak and not split:
        problems.append(
            f"a checkpoint brings the learner's state back ({learner_state / GIB:.1f} GiB) beside the engine's "
            f"weights ({engine_weights / GIB:.1f} GiB): raise learner.tensor_parallel_size, or "
            "rollout.vllm.tensor_parallel_size"
        )
    if rc.backend == "vllm" and kv_cache < kv_per_token * seq:
        problems.append(
            f"the engine's KV cache ({max(kv_cache, 0) / GIB:.1f} GiB) holds less than one {seq}-token sequence: raise "
            "rollout.vllm.gpu_memory_utilization or rollout.vllm.tensor_parallel_size"
        )
    try:
        out["placement"], out["routes"] = placement(cfg, gpus_per_node)
    except ConfigError as e:
        out["placement"], out["routes"] = [], []
        problems.append(f"no weight route: {e}")
    out["problems"] = problems
    from pc_megatron.runtime.resources import plan_threads

    threads = plan_threads(cfg)  # this machine's cores (a joined cluster: each actor's bundle)
    out["threads"], out["threads_warning"] = threads.describe(), threads.oversubscribed
    return out


def fp8_line(fp8: str, recipe: str, tp: int, dp: int) -> str:
    """How FP8 scaling stays in step across ranks (``learner/model.py``: ``tp_only_amax_red``)."""
    if not fp8:
        return ""
    return (
        f"{fp8} ({recipe} scaling): amax reduced over the {tp} tensor-parallel rank(s) only, never across the {dp} "
        "data-parallel ranks, which may run different micro-batch counts a step (token budget); the gradients, "
        "and so the weights, stay identical across data-parallel ranks"
    )


def _budget_line(res: dict) -> str:
    fits = f"the largest that fits is {res['fitting_budget']:,}"
    if not res["budget"]:
        return f"fixed rows (learner.max_tokens_per_micro_batch=0); {fits}"
    return f"{res['budget']:,} tokens per micro-batch (learner.max_tokens_per_micro_batch); {fits}"


def format_plan(res: dict) -> str:
    g = lambda x: f"{x / GIB:.1f} GiB"  # noqa: E731
    lines = [
        f"model            {res['model']}: {res['parameters'] / 1e9:.2f} B parameters",
        f"layout           {res['layout']}",
        f"per GPU          {res['params_per_gpu'] / 1e9:.2f} B parameters (largest pipeline stage / TP)",
        f"  weights        {g(res['weights'])} (bf16)",
        f"  gradients      {g(res['grads'])} (fp32 buffer)",
        f"  optimizer      {g(res['optimizer'])} (fp32 master + Adam moments; {g(res['optimizer_without_distopt'])} "
        f"without, {g(res['optimizer_with_distopt'])} with the distributed optimizer)",
        f"  activations    {g(res['activations'])} (a micro-batch of {res['micro_batch_tokens']:,} tokens, "
        f"sequences up to {res['sequence']}, no recompute)",
        f"  token budget   {_budget_line(res)}",
        f"  training peak  {g(res['train_peak'])}",
        f"  engine         {g(res['engine_weights'])} weights + {g(max(res['kv_cache'], 0))} KV cache "
        f"(~{res['kv_cache_tokens']:,.0f} tokens)",
        f"  generation     {g(res['gen_peak'])}",
        f"  checkpoint     {g(res['ckpt_peak'])}",
        f"  peak           {g(res['peak'])} of {g(res['gpu'])}",
        f"per step         {res['rollouts_per_step']}; <= {res['trained_tokens_per_step']:,} trained tokens",
    ]
    if res["placement_memory"]:
        lines.append(f"placement        {res['placement_memory']}")
    if res["fp8"]:
        lines.append(f"FP8              {res['fp8']}")
    lines.append(f"CPU threads      {res['threads'].removeprefix('threads: ')}")
    if res["threads_warning"]:
        lines.append(f"  warning        {res['threads_warning']}")
    if res["placement"]:
        lines += ["", "placement and weight routes", *(f"  {line}" for line in res["placement"])]
        nvls = os.environ.get("NCCL_NVLS_ENABLE")
        lines.append(
            f"  NCCL_NVLS_ENABLE={nvls} (yours)"
            if nvls is not None
            else "  NCCL_NVLS_ENABLE=0 for the actors (NVLink SHARP off until a GPU check shows it safe; set it to "
            "override)"
        )
    if res["problems"]:
        lines += ["", "DOES NOT FIT:", *(f"- {p}" for p in res["problems"])]
    else:
        lines += ["", "fits (estimate; allocator fragmentation and CUDA contexts add a few GiB)"]
    return "\n".join(lines)
