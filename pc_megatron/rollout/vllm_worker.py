"""Runs inside each vLLM worker process (``worker_extension_cls``): receives weight buckets and
loads them in place through vLLM's layerwise reload, and reports the weight version it serves.

One sync is bracketed once (``pcm_begin_sync`` ... ``pcm_end_sync``): vLLM buffers each layer's
tensors until the whole layer has arrived, then runs the layer's post-load processing (the CPU
backend repacks linear weights there), so a layer split across buckets is still processed once,
whole. Tied output layers need one more step: the CPU backend keeps a packed copy of the tied
embedding for the logits GEMM, and the reload rebuilds only the embedding's own copy, leaving
the output layer's stale (measured: log-prob error 3.0 after the embedding changed). After the
reload every embedding-method module (embedding and tied output layer) re-runs its post-load
processing, which rebuilds that copy from the updated weight (idempotent; nothing on GPU).

While a sync is open or after one failed, the version is ``None``: the driver refuses to
generate from a half-updated model.

The model is reached the way vLLM reaches it, ``Worker.get_model()``: on the GPU model runner
(V1) ``model_runner.model`` becomes a CUDA-graph wrapper when graphs are captured, and
``get_model`` unwraps it; Model Runner V2 (vLLM 0.32's GPU default) and the CPU runner return it as
is.
"""

from __future__ import annotations

import logging
from typing import Any

# Layers that legitimately receive no tensors in a sync: the tied output layer (its weight is the
# embedding's) and rotary embeddings (a computed cache). vLLM warns for each on every sync.
_NOTHING_TO_LOAD = ("ParallelLMHead: Failed to load weights", "RotaryEmbedding: Failed to load weights")


class _QuietExpected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in _NOTHING_TO_LOAD


class WeightSyncExtension:
    """Mixed into vLLM's worker class; methods are called through ``LLM.collective_rpc``."""

    _pcm_version: int | None = 0
    _pcm_receiver: Any = None
    _pcm_received: int = 0

    def pcm_weight_version(self) -> int | None:
        return self._pcm_version

    def pcm_gpu_uuid(self) -> str:
        """This worker's physical GPU (its UUID), '' on CPU."""
        from pc_megatron.weight_sync.buckets import gpu_uuid

        return gpu_uuid(self.device) if self.device.type == "cuda" else ""

    def pcm_watch_owner(self, owner: int) -> bool:
        """End this worker and the vLLM processes between it and ``owner`` (the process that built the
        engine: its engine core) once ``owner`` is gone, however it ended. vLLM's processes outlive a
        SIGKILLed or OOM-killed owner otherwise (seen: 3.7 GB held for 20 minutes after a run was
        OOM-killed). False, and nothing watched, where ``owner`` is not an ancestor (Ray's workers)."""
        import os
        import signal
        import threading
        import time

        import psutil

        me, chain = psutil.Process(), []
        for parent in me.parents():
            if parent.pid == owner:
                break
            chain.append(parent)
        else:
            return False
        started = psutil.Process(owner).create_time()

        def owner_alive() -> bool:
            try:
                return psutil.Process(owner).create_time() == started
            except psutil.Error:
                return False

        def watch() -> None:
            while owner_alive():
                time.sleep(0.5)
            for p in chain:  # psutil checks each pid is still the process it was
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            os._exit(1)

        threading.Thread(target=watch, name="pcm-owner-watch", daemon=True).start()
        return True

    def _pcm_bucket_receiver(self) -> Any:
        from pc_megatron.weight_sync.receiver import BucketReceiver

        if self._pcm_receiver is None:
            self._pcm_receiver = BucketReceiver(self.device, worker=self.rank)  # routed: this worker's handle
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_QuietExpected())
        return self._pcm_receiver

    def pcm_join_group(self, info: dict, first_rank: int) -> str:
        """Join the ``broadcast`` transport's group (rank ``first_rank`` + this worker's rank in
        the engine); the membership lasts across syncs. Returns the group key."""
        return self._pcm_bucket_receiver().join(info, first_rank + self.rank)

    def pcm_begin_sync(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        self._pcm_version = None
        self._pcm_received = 0
        self._pcm_bucket_receiver()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.get_model())

    def pcm_load_bucket(self, handle: dict) -> int:
        """Load one bucket; returns the number of tensors taken."""
        from vllm.config import set_current_vllm_config

        tensors = self._pcm_receiver.open(handle)
        with set_current_vllm_config(self.vllm_config):
            self.get_model().load_weights(iter(tensors))
        self._pcm_received += len(tensors)
        return len(tensors)

    def pcm_end_sync(self, version: int, expected_tensors: int) -> int | None:
        """Finish the reload. ``version`` becomes the served version only if every tensor the
        driver sent arrived (``expected_tensors``) and the driver's manifest was complete."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        model = self.get_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            for module in model.modules():
                method = getattr(module, "quant_method", None)
                if type(method).__name__ == "UnquantizedEmbeddingMethod":
                    method.process_weights_after_loading(module)
        self._pcm_receiver.close()
        self._pcm_version = version if version >= 0 and self._pcm_received == expected_tensors else None
        return self._pcm_version
