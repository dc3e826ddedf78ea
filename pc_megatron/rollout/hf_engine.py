"""Rollout engine on ``transformers``: batched sampling with a KV cache, on CPU or GPU, in the
training process (the CPU default and the tests' reference for the vLLM engine)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from pc_megatron.errors import ModelFileError
from pc_megatron.rollout.base import Completion, OnPrompt, sample_seed, stream_by_calls
from pc_megatron.rollout.config import SamplingParams
from pc_megatron.weight_sync.manifest import Manifest
from pc_megatron.weight_sync.receiver import BucketReceiver
from pc_megatron.weight_sync.transport import LocalSender, push_weights


class HFEngine:
    def __init__(self, model_dir: str | Path, max_batch_size: int = 512, device: str | None = None) -> None:
        from transformers import AutoModelForCausalLM

        from pc_megatron.model.tokenizer import load_tokenizer

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise ModelFileError(f"{model_dir}: no config.json; the rollout engine needs a Hugging Face model folder")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(self.device)
        self.model.eval()
        self.tokenizer = load_tokenizer(model_dir)
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        self.max_batch_size = max_batch_size
        self.weight_version = 0
        # lm_head is tied to embed_tokens in tied models: named_parameters lists it once
        self.manifest = Manifest({n: (tuple(p.shape), p.dtype) for n, p in self.model.named_parameters()})
        self.sender = LocalSender(bucket_bytes=512 << 20)
        self._receiver = BucketReceiver(self.device)
        self._staged: dict[str, torch.Tensor] = {}

    def served_dtype(self) -> str:
        return str(next(self.model.parameters()).dtype)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Staged: every tensor is checked and copied aside before any weight changes, so a bad
        stream leaves the engine serving its previous weights."""
        return push_weights(named_tensors, self.manifest, self.sender, [self], version)

    def begin_sync(self) -> None:
        self._staged = {}

    def gpu_ids(self) -> list[str]:
        """The one process's GPU (UUID), '' on CPU."""
        from pc_megatron.weight_sync.buckets import gpu_uuid

        return [gpu_uuid(self.device) if self.device.type == "cuda" else ""]

    def sync_ranks(self) -> int:
        """Processes that receive a broadcast sync: this one."""
        return 1

    def join_group(self, info: dict, first_rank: int) -> str:
        """Join the broadcast transport's group (``weight_sync.broadcast_group.BroadcastGroup``)."""
        return self._receiver.join(info, first_rank)

    def load_bucket(self, handle: dict) -> int:
        tensors = self._receiver.open(handle)
        self._staged.update(tensors)
        return len(tensors)

    @torch.no_grad()
    def end_sync(self, version: int, sent: int) -> int | None:
        staged, self._staged = self._staged, {}
        if version >= 0 and len(staged) == sent:
            params = dict(self.model.named_parameters())
            for name, tensor in staged.items():
                params[name].copy_(tensor)
            self.weight_version = version
        return self.weight_version

    def sleep(self) -> None:
        """Nothing to release: the model lives in the training process."""

    def close(self) -> None:
        """Nothing to stop but a broadcast group's membership."""
        self._receiver.leave()

    streams = False  # one batched forward at a time: a window is one call (``stream_by_calls``)

    def generate_stream(
        self, prompts: list[list[int]], n: list[int], params: SamplingParams, seed: int, on_group: OnPrompt
    ) -> list[Completion]:
        return stream_by_calls(self, prompts, n, params, seed, on_group)

    @torch.no_grad()
    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        out = []
        for p in prompts:
            ids = torch.tensor([p], device=self.device)
            logp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1].float(), -1)
            out.append(logp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist())
        return out

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        n: int | list[int],
        params: SamplingParams,
        seed: int,
        first_prompt: int = 0,
    ) -> list[Completion]:
        counts = [n] * len(prompts) if isinstance(n, int) else n
        rows = [(i, p, j) for i, (p, k) in enumerate(zip(prompts, counts, strict=True)) for j in range(k)]
        out: list[Completion] = []
        for start in range(0, len(rows), self.max_batch_size):
            chunk = rows[start : start + self.max_batch_size]
            gens = [
                torch.Generator(device=self.device).manual_seed(sample_seed(seed, first_prompt + i, j))
                for i, _, j in chunk
            ]
            out.extend(self._generate_batch([(i, p) for i, p, _ in chunk], params, gens))
        return out

    def _generate_batch(
        self, rows: list[tuple[int, list[int]]], params: SamplingParams, gens: list[torch.Generator]
    ) -> list[Completion]:
        b = len(rows)
        width = max(len(p) for _, p in rows)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        for r, (_, p) in enumerate(rows):  # left padding keeps the last position aligned
            ids[r, width - len(p) :] = torch.tensor(p)
            attn[r, width - len(p) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        stop = torch.tensor([self.eos_id, *params.stop_token_ids], device=self.device)

        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        tokens, logps = [], []
        for _ in range(params.max_new_tokens):
            logits = out.logits[:, -1, :].float()
            tok, logp = self._sample(logits, params, gens)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens.append(tok)
            logps.append(logp)
            alive = ~done
            done = done | torch.isin(tok, stop)
            if bool(done.all()):
                break
            attn = torch.cat([attn, alive.long()[:, None]], dim=1)
            pos = pos[:, -1:] + 1
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=pos,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
        tok_mat = torch.stack(tokens, 1).cpu()
        logp_mat = torch.stack(logps, 1).cpu()
        completions = []
        stop_set = set(stop.tolist())
        for r, (pi, _) in enumerate(rows):
            ids_r, lp_r, reason = [], [], "length"
            for t in range(tok_mat.shape[1]):
                tid = int(tok_mat[r, t])
                ids_r.append(tid)
                lp_r.append(float(logp_mat[r, t]))
                if tid in stop_set:
                    reason = "stop"
                    break
            completions.append(Completion(pi, ids_r, lp_r, reason, self.weight_version))
        return completions

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, gens: list[torch.Generator]):
        """Greedy, or one draw per row from softmax(logits / T) (top-p truncated) by the Gumbel-max
        trick with each row's own generator: a sample depends on its seed, not on its batch."""
        if params.temperature == 0:
            tok = logits.argmax(-1)
            return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        logp_full = torch.log_softmax(logits / params.temperature, -1)
        logp = logp_full
        if params.top_p < 1.0:
            sorted_p, order = logp_full.exp().sort(-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < params.top_p  # always keeps the top token
            mask = torch.zeros_like(keep).scatter(-1, order, keep)
            logp = logp_full.masked_fill(~mask, float("-inf"))
        u = torch.stack([torch.rand(logits.shape[-1], generator=g, device=logits.device) for g in gens])
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
        tok = (logp + gumbel).argmax(-1)
        return tok, logp_full.gather(-1, tok[:, None]).squeeze(-1)
