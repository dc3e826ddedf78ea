"""Build a Megatron-Core ``GPTModel`` from an HF architecture spec, and what trains it (the
data-parallel wrapper, the optimizer and the learning-rate schedule)."""

from __future__ import annotations

import importlib.util

import torch

from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.parallel import ParallelState
from pc_megatron.model.arch import ArchSpec


def resolve_transformer_impl(requested: str) -> str:
    if requested != "auto":
        return requested
    te = importlib.util.find_spec("transformer_engine") is not None
    return "transformer_engine" if torch.cuda.is_available() and te else "local"


def transformer_config(
    arch: ArchSpec,
    parallel: ParallelState,
    bf16: bool,
    fp8: str = "",
    fp8_recipe: str = "delayed",
    sp: bool = False,
    te: bool = False,
):
    """``te``: the Transformer Engine layer spec, on which (on CUDA) Megatron's fused RoPE (THD
    included), SwiGLU and bias-dropout-add kernels run."""
    from megatron.core.transformer import TransformerConfig

    on_gpu = torch.cuda.is_available()
    fused = te and on_gpu
    pp = parallel.pipeline_parallel_size
    dtype = torch.bfloat16 if bf16 else torch.float32
    return TransformerConfig(
        tensor_model_parallel_size=parallel.tensor_parallel_size,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=dtype,
        # micro-batches differ in rows (the last one) and length (batches are padded per step):
        # stages exchange activation shapes before the activations
        variable_seq_lengths=pp > 1,
        moe_token_dispatcher_type="alltoall",  # dense models; Megatron's check for the line above
        # the loss function returns (sum over tokens, token count); Megatron divides the
        # gradients by the token count summed over micro-batches and data-parallel ranks
        calculate_per_token_loss=True,
        sequence_parallel=sp,
        fp8=fp8 or None,
        fp8_recipe=fp8_recipe,
        # FP8 scaling factors (amax) are reduced over the tensor-parallel ranks only: each FP8 forward
        # and backward would otherwise wait on every data-parallel rank, and the token-budget planner
        # gives data-parallel ranks different micro-batch counts, so a rank done early would be in the
        # gradient reduction while the others wait in an amax reduction (a deadlock at the first step)
        tp_only_amax_red=bool(fp8),
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        bf16=bf16,
        use_cpu_initialization=not on_gpu,
        # Megatron's fused kernels: CUDA with the TE spec only (the local spec's CPU runs take the
        # unfused paths; its softmax and layer norm are not used by the TE spec)
        bias_activation_fusion=fused,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=fused,
        apply_rope_fusion=fused,
    )


def build_gpt_model(
    arch: ArchSpec,
    parallel: ParallelState,
    transformer_impl: str,
    bf16: bool,
    fp8: str = "",
    fp8_recipe: str = "delayed",
    sp: bool = False,
):
    """Megatron-Core GPTModel for ``arch``: this rank's pipeline stage (its layers, plus the
    embedding on the first stage and the output layer on the last). FP8 and sequence
    parallelism need the TE spec on a GPU; asking for them elsewhere is a ConfigError."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs

    impl = resolve_transformer_impl(transformer_impl)
    if (fp8 or sp) and impl != "transformer_engine":
        from pc_megatron.errors import ConfigError

        what = "learner.fp8" if fp8 else "learner.sequence_parallel"
        raise ConfigError(f"{what} needs a CUDA GPU with Transformer Engine (this run uses the '{impl}' layer spec)")
    if impl == "transformer_engine":
        layer_spec = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_norm)
    else:
        from pc_megatron.learner.packed_attention import PackedDotProductAttention

        layer_spec = specs.get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_norm)
        # the local attention plus packed (THD) micro-batches; unpacked input takes the parent's path
        layer_spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    model = GPTModel(
        config=transformer_config(arch, parallel, bf16, fp8, fp8_recipe, sp, te=impl == "transformer_engine"),
        transformer_layer_spec=layer_spec,
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
        rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 8.0,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        parallel_output=False,  # full-vocabulary logits on every TP rank (gathered by the output layer)
        pre_process=parallel.first_stage,
        post_process=parallel.last_stage,
    )
    if bf16 and impl == "local":
        # the local spec's norms are torch modules made in fp32 whatever params_dtype says; Megatron's
        # Float16Module would cast them, and its bf16 optimizer keeps fp32 main copies of bf16
        # parameters only (a fp32 one among them breaks its checkpoint's parameter map): cast them,
        # as TE's norms are made in bf16
        for param in model.parameters():
            if param.dtype == torch.float32:
                param.data = param.data.to(torch.bfloat16)
    if torch.cuda.is_available():
        model = model.cuda()
    return model


def build_training(module: torch.nn.Module, cfg: LearnerConfig):
    """``(model, optimizer, lr_schedule)`` for this stage's ``module``: Megatron-Core's
    DistributedDataParallel around it (gradients reduced in fp32), its Adam (distributed or not)
    and the learning-rate schedule (linear warm-up, then ``cfg.lr_decay_style`` to ``min_lr``)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    module.config.finalize_model_grads_func = finalize_model_grads
    model = DistributedDataParallel(
        module.config,
        DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=cfg.distributed_optimizer),
        module,
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=cfg.lr,
            min_lr=cfg.min_lr,
            weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1,
            adam_beta2=cfg.adam_beta2,
            adam_eps=cfg.adam_eps,
            clip_grad=cfg.clip_grad,
            bf16=cfg.bf16,
            params_dtype=torch.bfloat16 if cfg.bf16 else torch.float32,
            use_distributed_optimizer=cfg.distributed_optimizer,
        ),
        [model],
    )
    lr_schedule = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if cfg.lr_warmup_steps else cfg.lr,
        max_lr=cfg.lr,
        min_lr=cfg.min_lr,
        lr_warmup_steps=cfg.lr_warmup_steps,
        lr_decay_steps=max(cfg.lr_decay_steps, cfg.lr_warmup_steps + 1),
        lr_decay_style=cfg.lr_decay_style,
        start_wd=cfg.weight_decay,
        end_wd=cfg.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return model, optimizer, lr_schedule
