"""The parallel learner (``pc_megatron/learner/parallel.py``) over gloo, two processes, for each model family
(Qwen2 tied, Qwen3, Llama 3):

- TP=2 and PP=2 logits match transformers; HF -> Megatron(TP=2 or PP=2) -> HF is bit-identical;
- one RL step at TP=2, at PP=2, and at DP=2 with the distributed optimizer equals the same step
  in one process;
- a learner checkpoint saved at TP=2, PP=2 or DP=2 (distributed optimizer) resumes in one
  process with the same loss and the same update (model and Adam moments resharded); the TP=2
  and PP=2 ones convert to HF folders whose transformers logits are the learner's;
- a deliberately wrong shard layout (fc1 split as plain row blocks) makes the parity check fail;
- at real shape, a ragged batch through token-budget micro-batches, padded or packed (THD), at TP/PP/DP
  1 and 2: one update's loss and every gradient are the same (within 1e-5 of each tensor's scale)
  however the batch is cut and laid out and however the model is split; the pipeline export keeps
  each tensor's dtype.
"""

from pathlib import Path

import pytest
import torch

from pc_megatron.learner.export import load_hf_weights
from pc_megatron.model.arch import load_arch
from pc_megatron.weight_sync.sharding import unshard
from tests.hf_models import CONFIGS, make_hf_model
from tests.tensor_checks import scaled_error
from tests.torchrun import torchrun
from tests.workers.parallel_worker import SHAPES, batch, ragged_batch

# name: (processes, TP, PP, extra environment)
LAYOUTS = {
    "single": (1, 1, 1, {}),
    "tp2": (2, 2, 1, {}),
    "pp2": (2, 1, 2, {}),
    "dp2-distopt": (2, 1, 1, {"PCM_DIST_OPT": "1", "PCM_MICRO_BATCH": "1"}),
}


def kl_and_diff(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    logp, logq = torch.log_softmax(ref, -1), torch.log_softmax(ours, -1)
    return float((ours - ref).abs().max()), float((logp.exp() * (logp - logq)).sum(-1).mean())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    folders = []
    for name in sorted(CONFIGS):
        folders.append(root / name)
        make_hf_model(name, folders[-1])
    results = {}
    for layout, (nproc, tp, pp, env) in LAYOUTS.items():
        torchrun(root / layout, nproc, [tp, pp, "check", *folders], env)
    for saved in ("tp2", "pp2", "dp2-distopt"):  # each resumed in one process (same optimizer kind)
        env = {"PCM_DIST_OPT": "1"} if "distopt" in saved else {}
        torchrun(root / f"from-{saved}", 1, [1, 1, "resume", root / saved / "ckpt", *folders], env)
    for run in (*LAYOUTS, "from-tp2", "from-pp2", "from-dp2-distopt"):
        results[run] = {f.name: torch.load(root / run / f"{f.name}.pt") for f in folders}
    return root, folders, results


def reference_logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=batch(1).tokens).logits.float()


@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2-distopt"])
def test_parallel_logits_match_transformers(runs, layout):
    _, folders, results = runs
    for folder in folders:
        diff, kl = kl_and_diff(results[layout][folder.name]["logits"], reference_logits(folder))
        assert diff < 1e-4 and kl < 1e-6, (layout, folder.name, diff, kl)


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_hf_to_megatron_to_hf_is_bit_identical(runs, layout):
    _, folders, results = runs
    for folder in folders:
        original, exported = load_hf_weights(folder), results[layout][folder.name]["hf"]
        tied = load_arch(folder).tie_word_embeddings
        assert set(exported) == set(original) - ({"lm_head.weight"} if tied else set())
        for key, t in exported.items():
            assert torch.equal(t, original[key]), (layout, folder.name, key)


@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2-distopt"])
def test_one_rl_step_equals_the_single_process_step(runs, layout):
    _, folders, results = runs
    for folder in folders:
        one, par = results["single"][folder.name], results[layout][folder.name]
        for key in ("loss", "entropy"):
            assert abs(one["stats"][key] - par["stats"][key]) < 1e-6, (layout, folder.name, key)
        assert abs(one["stats"]["grad_norm"] - par["stats"]["grad_norm"]) < 1e-4 * one["stats"]["grad_norm"]
        assert (one["logits_after"] - par["logits_after"]).abs().max() < 1e-4, (layout, folder.name)
        assert (one["logits_after"] - one["logits"]).abs().max() > 1e-3  # the step did move the model


@pytest.mark.parametrize("saved", ["tp2", "pp2", "dp2-distopt"])
def test_checkpoint_saved_parallel_resumes_in_one_process_with_identical_loss(runs, saved):
    _, folders, results = runs
    for folder in folders:
        cont, resumed = results[saved][folder.name], results[f"from-{saved}"][folder.name]
        assert resumed["version"] == 1
        assert abs(cont["stats2"]["loss"] - resumed["stats2"]["loss"]) < 1e-6, (saved, folder.name)
        assert abs(cont["stats2"]["grad_norm"] - resumed["stats2"]["grad_norm"]) < 1e-5 * cont["stats2"]["grad_norm"]
        # the update used the saved Adam moments: a fresh optimizer's first step would differ by ~lr
        assert (cont["logits_after2"] - resumed["logits_after2"]).abs().max() < 1e-4, (saved, folder.name)


@pytest.mark.parametrize("saved", ["tp2", "pp2"])
def test_checkpoint_saved_parallel_converts_to_hf_with_the_learners_logits(runs, saved, tmp_path):
    """`convert --to hf` of a training checkpoint written at TP=2 / PP=2: transformers, loading the
    result offline, computes the logits the learner had when it saved."""
    import shutil

    from transformers import AutoModelForCausalLM

    from pc_megatron.checkpoint.store import copy_hf_side_files
    from pc_megatron.cli import main

    root, folders, results = runs
    for folder in folders:
        step = tmp_path / folder.name / "step_000001"
        shutil.copytree(root / saved / "ckpt" / folder.name, step / "learner")
        copy_hf_side_files(folder, step / "hf")
        assert main(["convert", "--to", "hf", str(step), str(tmp_path / folder.name / "hf-out")]) == 0
        model = AutoModelForCausalLM.from_pretrained(str(tmp_path / folder.name / "hf-out"), dtype=torch.float32)
        with torch.no_grad():
            logits = model.eval()(input_ids=batch(1).tokens).logits
        diff, kl = kl_and_diff(results[saved][folder.name]["logits_after"], logits)
        assert diff < 1e-4 and kl < 1e-6, (saved, folder.name, diff, kl)


def test_negative_control_wrong_shard_layout_breaks_tp2_parity(runs, tmp_path):
    _, folders, _ = runs
    folder = folders[0]
    torchrun(tmp_path, 2, [2, 1, "check", folder], env={"PCM_BAD_GLU_SHARD": "1"})
    diff, _ = kl_and_diff(torch.load(tmp_path / f"{folder.name}.pt")["logits"], reference_logits(folder))
    assert diff > 1e-3


# the shape runs, name: (processes, TP, PP)
SHAPE_LAYOUTS = {"single": (1, 1, 1), "tp2": (2, 2, 1), "pp2": (2, 1, 2), "dp2": (2, 1, 1)}
MODEL = "qwen2-tied"  # tied embeddings: at PP 2 the two copies' gradients must add up


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shape")
    folder = root / MODEL
    make_hf_model(MODEL, folder)
    for layout, (nproc, tp, pp) in SHAPE_LAYOUTS.items():
        torchrun(root / layout, nproc, [tp, pp, "shape", folder])
    return root


def _assemble(root: Path, layout: str, shape: str) -> tuple[dict[str, torch.Tensor], float, torch.Tensor]:
    """Full gradients (TP shards joined, stages merged, data-parallel rank 0), the loss and rank 0's
    log-probs of one layout's run."""
    shards: dict[str, dict[int, torch.Tensor]] = {}
    loss, logprobs = None, None
    for path in sorted((root / layout).glob(f"{MODEL}-{shape}-rank*.pt")):
        part = torch.load(path)
        if path.stem.endswith("rank0"):
            loss, logprobs = part["loss"], part["logprobs"]
        if part["dp"] != 0:
            continue
        for name, g in part["grads"].items():
            shards.setdefault(name, {})[part["tp"]] = g
    full = {n: unshard(n, [s[r] for r in sorted(s)]) if len(s) > 1 else s[0] for n, s in shards.items()}
    full.pop("output_layer.weight", None)  # the last stage's copy of the tied embedding (PP > 1)
    return full, loss, logprobs


@pytest.mark.parametrize("layout", list(SHAPE_LAYOUTS))
def test_gradients_loss_and_logprobs_do_not_depend_on_cut_layout_or_parallelism(shapes, layout):
    ref_grads, ref_loss, ref_logp = _assemble(shapes, "single", "rows3")
    trained = ragged_batch()[0].loss_mask != 0  # log-probs where a loss reads them, zero elsewhere
    assert ref_logp[~trained].abs().max() == 0 and ref_logp[trained].abs().min() > 0
    for shape in SHAPES:
        grads, loss, logp = _assemble(shapes, layout, shape)
        assert set(grads) == set(ref_grads), (layout, shape)
        assert loss == pytest.approx(ref_loss, rel=1e-5), (layout, shape)
        assert (logp - ref_logp).abs().max() < 1e-5, (layout, shape)
        worst = max((scaled_error(grads[n], ref_grads[n]), n) for n in ref_grads)
        assert worst[0] < 1e-5, (layout, shape, worst)


def test_pipeline_export_keeps_each_tensors_dtype(shapes):
    """PP 2 with bf16 linear weights and fp32 norms: every stage receives each tensor in its owner's
    dtype (the receiving stage used to allocate everything in its first parameter's dtype)."""
    dtypes = torch.load(shapes / "pp2" / f"{MODEL}-dtypes.pt")
    assert dtypes, "nothing exported"
    for name, dtype in dtypes.items():
        assert dtype == (torch.bfloat16 if "proj" in name else torch.float32), name
