"""RL prompt pools of the embedded task, chosen by the initial policy's pass rate.

``data.synthetic.pool=hard`` trains on the train split as drawn: about half of the groups start
degenerate (all-correct or all-wrong), the regime of the paper. ``easy`` trains on prompts from
the same families whose pass rate under the initial policy (the warm-start) lies in
``data.synthetic.easy_pass_band``, so few groups are degenerate and uniform allocation wastes
little. Difficulty filtering of a prompt set with the starting model is a common curation step;
here it makes the regime in which Pilot-Commit should *not* help.

The pass rate is exact rather than sampled: with a character-level tokenizer and the exact-match
reward, a sampled completion is correct when it spells the answer and then EOS, and the
probability of that is one teacher-forced forward pass. Other correct spellings (a leading zero,
surrounding spaces) are ignored, so the figure is a slight under-estimate. It is taken at
``rollout.temperature`` with no top-p truncation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pc_megatron.batch import sft_batch
from pc_megatron.data.dataset import PromptRow, load_rows, write_jsonl
from pc_megatron.data.task import Task, config_hash
from pc_megatron.embedded.config import SyntheticTaskConfig
from pc_megatron.embedded.task import pool_candidates, split_fields
from pc_megatron.errors import ConfigError
from pc_megatron.model.tokenizer import load_tokenizer

POOL_FORMAT = 1  # bump when the selection changes, to invalidate cached pools
MAX_CHUNKS = 8  # candidate chunks of 4 x num_train prompts before giving up


def pass_rate_scorer(model_dir: str | Path, temperature: float, batch_size: int = 1024):
    """A function ``rows -> [P(answer + EOS | prompt)]`` under the HF model at ``model_dir``
    (loaded once, for any number of calls)."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.no_grad()
    def score(rows: list[PromptRow]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(rows), batch_size):
            batch = sft_batch(tokenizer, rows[start : start + batch_size])
            logits = model(input_ids=batch.tokens).logits[:, :-1].float() / temperature
            logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.tokens[:, 1:, None]).squeeze(-1)
            out += (logp * batch.loss_mask).sum(1).exp().tolist()
        return out

    return score


def answer_pass_rates(model_dir: str | Path, rows: list[PromptRow], temperature: float) -> list[float]:
    """``P(answer + EOS | prompt)`` for each row under the HF model at ``model_dir``."""
    return pass_rate_scorer(model_dir, temperature)(rows)


def degenerate_share(rates: list[float], n: int) -> float:
    """Expected share of n-sample groups whose rewards are all equal (all right or all wrong),
    for prompts with these exact pass rates: the mean of p^n + (1 - p)^n."""
    return sum(p**n + (1 - p) ** n for p in rates) / len(rates)


HOPELESS, SOLVED = 0.02, 0.98  # graded pool: exact initial pass rate below / above these


def pool_quotas(syn: Any) -> list[tuple[str, float, float, int]]:
    """``(name, low, high, count)`` per share of the pool: an exact initial pass rate in
    ``[low, high]`` (a hopeless prompt below 0.02 and a solved one above 0.98, strictly)."""
    n = syn.pool_size or syn.num_train
    if syn.pool == "easy":
        lo, hi = syn.easy_pass_band
        return [("in band", lo, hi, n)]
    hopeless, solved = round(syn.hopeless_frac * n), round(syn.solved_frac * n)
    eps = 1e-12
    return [
        ("hopeless", 0.0, HOPELESS - eps, hopeless),
        ("solved", SOLVED + eps, 1.0, solved),
        ("informative", HOPELESS, SOLVED, n - hopeless - solved),
    ]


def select_pool(
    syn: SyntheticTaskConfig,
    task: Task,
    policy_dir: Path,
    policy_key: str,
    temperature: float,
    cache: Path,
    samples_per_prompt: int,
    progress: bool = True,
) -> Task:
    """``task`` with its train split replaced by the pool ``syn.pool`` under the policy at
    ``policy_dir`` (``policy_key``: its warm-start key), pass rates at ``temperature``, cached under
    ``cache`` by everything that determines it. The held-out and SFT splits are unchanged. Candidates
    are scored in the order they are drawn and each share of the pool takes the first ones in its
    band; ``samples_per_prompt`` sizes the degenerate share printed at the end."""
    if syn.pool == "hard":
        return Task(task.train[: syn.pool_size], task.eval, task.sft) if syn.pool_size else task
    quotas = pool_quotas(syn)
    fields = [syn.pool, syn.easy_pass_band] if syn.pool == "easy" else [syn.pool, syn.hopeless_frac, syn.solved_frac]
    fields += [syn.pool_size] if syn.pool_size else []  # (earlier pools' cache keys unchanged)
    key = config_hash(POOL_FORMAT, split_fields(syn), *fields, policy_key, temperature)
    path = cache / "pools" / key / "train.jsonl"
    if path.is_file():
        return Task(load_rows(path), task.eval, task.sft)

    exclude = {r.prompt for r in task.eval}  # the held-out split stays held out
    chosen: list[tuple[int, PromptRow]] = []  # (candidate order, row)
    taken = [0] * len(quotas)
    seen = 0
    score = pass_rate_scorer(policy_dir, temperature)
    for chunk in range(MAX_CHUNKS):
        candidates = pool_candidates(syn, 4 * syn.num_train, exclude, chunk)
        if not candidates:
            break
        rates = score(candidates)
        for row, rate in zip(candidates, rates, strict=True):
            exclude.add(row.prompt)
            for q, (_, lo, hi, count) in enumerate(quotas):
                if lo <= rate <= hi and taken[q] < count:
                    taken[q] += 1
                    chosen.append(
                        (seen, PromptRow(row.id, row.prompt, row.answer, {**row.meta, "initial_pass_rate": rate}))
                    )
                    break
            seen += 1
        if progress:
            shares = ", ".join(f"{name} {t}/{c}" for (name, _, _, c), t in zip(quotas, taken, strict=True))
            print(f"{syn.pool} pool: {shares} from {seen} candidates", flush=True)
        if all(t >= c for (_, _, _, c), t in zip(quotas, taken, strict=True)):
            break
    short = [(name, lo, hi, c, t) for (name, lo, hi, c), t in zip(quotas, taken, strict=True) if t < c]
    if short:
        name, lo, hi, c, t = short[0]
        raise ConfigError(
            f"data.synthetic.pool={syn.pool}: only {t} of {seen} candidate prompts are {name} (initial pass rate in "
            f"[{lo:.2f}, {hi:.2f}]), {c} needed: "
            + (
                "widen data.synthetic.easy_pass_band or lower data.synthetic.num_train"
                if syn.pool == "easy"
                else "lower data.synthetic.hopeless_frac / solved_frac or data.synthetic.num_train"
            )
        )
    rows = [
        PromptRow(f"train-{i}", r.prompt, r.answer, r.meta)
        for i, (_, r) in enumerate(sorted(chosen, key=lambda x: x[0]))
    ]
    write_jsonl(rows, path)
    if progress:
        rates = [r.meta["initial_pass_rate"] for r in rows]
        n = samples_per_prompt
        print(
            f"{syn.pool} pool: expected degenerate share of {n}-sample groups at the start "
            f"{degenerate_share(rates, n):.3f}",
            flush=True,
        )
    return Task(rows, task.eval, task.sft)
