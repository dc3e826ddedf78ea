"""Rollout engine on ``transformers``: batched sampling with a KV cache, on CPU or GPU, in the
training process (the CPU default and the tests' reference for the vLLM engine)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import torch

from pc_megatron.errors import ModelFileError
from pc_megatron.rollout.base import Completion, SamplingParams
from pc_megatron.weight_sync.manifest import Manifest


class HFEngine:
    def __init__(self, model_dir: str | Path, max_batch_size: int = 512, device: str | None = None) -> None:
        from transformers import AutoModelForCausalLM

        from pc_megatron.model.tiny import load_tokenizer

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

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Staged: every tensor is checked and copied aside before any weight changes, so a bad
        stream leaves the engine on its previous weights."""
        t0 = time.perf_counter()
        staged = [(n, t.to(self.device, copy=True)) for n, t in self.manifest.checked(named_tensors)]
        params = dict(self.model.named_parameters())
        for name, tensor in staged:
            params[name].copy_(tensor)
        self.weight_version = version
        dt = time.perf_counter() - t0
        nbytes = float(sum(t.numel() * t.element_size() for _, t in staged))
        return {"weight_sync_s": dt, "weight_sync_bytes": nbytes, "weight_sync_gbps": nbytes / dt / 1e9}

    def sleep(self) -> None:
        """Nothing to release: the model lives in the training process."""

    def close(self) -> None:
        """Nothing to stop."""

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
        self, prompts: list[list[int]], n: int | list[int], params: SamplingParams, seed: int
    ) -> list[Completion]:
        counts = [n] * len(prompts) if isinstance(n, int) else n
        rows = [(i, p) for i, (p, k) in enumerate(zip(prompts, counts, strict=True)) for _ in range(k)]
        gen = torch.Generator(device=self.device).manual_seed(seed)
        out: list[Completion] = []
        for start in range(0, len(rows), self.max_batch_size):
            out.extend(self._generate_batch(rows[start : start + self.max_batch_size], params, gen))
        return out

    def _generate_batch(
        self, rows: list[tuple[int, list[int]]], params: SamplingParams, gen: torch.Generator
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
            tok, logp = self._sample(logits, params, gen)
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
    def _sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator):
        if params.temperature == 0:
            tok = logits.argmax(-1)
            return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        logp_full = torch.log_softmax(logits / params.temperature, -1)
        probs = logp_full.exp()
        if params.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < params.top_p  # always keeps the top token
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        return tok, logp_full.gather(-1, tok[:, None]).squeeze(-1)
