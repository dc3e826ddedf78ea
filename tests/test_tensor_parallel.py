"""Tensor parallelism over gloo, two processes: each family's TP=2 logits match transformers,
HF -> Megatron(TP=2) -> HF is bit-identical, and one RL step at TP=2 equals the same step at TP=1.
A deliberately wrong shard layout (fc1 split as plain row blocks) makes the parity check fail."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_model_families import CONFIGS, make_hf_model

from pc_megatron.learner.learner import load_hf_weights
from pc_megatron.model.arch import load_arch

WORKER = Path(__file__).parent / "workers" / "tp_worker.py"


def torchrun(out: Path, tp: int, folders: list[Path], env: dict | None = None) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}", str(WORKER)]
    proc = subprocess.run(
        [*cmd, str(out), str(tp), *map(str, folders)],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def kl_and_diff(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    logp, logq = torch.log_softmax(ref, -1), torch.log_softmax(ours, -1)
    return float((ours - ref).abs().max()), float((logp.exp() * (logp - logq)).sum(-1).mean())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    folders = []
    for name in sorted(CONFIGS):
        folders.append(root / name)
        make_hf_model(name, folders[-1])
    results = {}
    for tp in (1, 2):
        (root / f"tp{tp}").mkdir()
        torchrun(root / f"tp{tp}", tp, folders)
        results[tp] = {f.name: torch.load(root / f"tp{tp}" / f"{f.name}.pt") for f in folders}
    return root, folders, results


def reference_logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokens = torch.randint(0, 96, (3, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def test_tp2_logits_match_transformers(runs):
    _, folders, results = runs
    for folder in folders:
        diff, kl = kl_and_diff(results[2][folder.name]["logits"], reference_logits(folder))
        assert diff < 1e-4 and kl < 1e-6, (folder.name, diff, kl)


def test_hf_to_megatron_tp2_to_hf_is_bit_identical(runs):
    _, folders, results = runs
    for folder in folders:
        original, exported = load_hf_weights(folder), results[2][folder.name]["hf"]
        tied = load_arch(folder).tie_word_embeddings
        assert set(exported) == set(original) - ({"lm_head.weight"} if tied else set())
        for key, t in exported.items():
            assert torch.equal(t, original[key]), (folder.name, key)


def test_one_rl_step_at_tp2_equals_tp1(runs):
    _, folders, results = runs
    for folder in folders:
        one, two = results[1][folder.name], results[2][folder.name]
        assert abs(one["stats"]["loss"] - two["stats"]["loss"]) < 1e-6, folder.name
        assert abs(one["stats"]["grad_norm"] - two["stats"]["grad_norm"]) < 1e-4 * one["stats"]["grad_norm"]
        assert (one["logits_after"] - two["logits_after"]).abs().max() < 1e-4, folder.name
        assert (one["logits_after"] - one["logits"]).abs().max() > 1e-3  # the step did move the model


def test_negative_control_wrong_shard_layout_breaks_tp2_parity(runs, tmp_path):
    _, folders, _ = runs
    folder = folders[0]
    torchrun(tmp_path, 2, [folder], env={"PCM_BAD_GLU_SHARD": "1"})
    diff, _ = kl_and_diff(torch.load(tmp_path / f"{folder.name}.pt")["logits"], reference_logits(folder))
    assert diff > 1e-3
