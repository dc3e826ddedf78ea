"""Atomic training-state checkpoints and HF-format model export.

Layout of a run directory's ``checkpoints/``::

    step_000025/learner/     model, optimizer and lr schedule: a Megatron-Core distributed
                             checkpoint (loadable at any TP/PP; see Learner.save)
    step_000025/state.pt     scheduler and loop state, RNG states: plain data (``plain.py``), read
                             with ``weights_only=True``
    step_000025/hf/          config and tokenizer files of the model (for `pc-megatron convert`)
    step_000025/huggingface/ with checkpoint.save_hf: the model as a Hugging Face folder
    latest                   text file naming the newest complete checkpoint

A checkpoint is written to ``step_N.tmp`` and renamed when complete; ``latest`` is replaced
atomically after that, so a kill at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from pc_megatron.checkpoint.plain import from_plain, legacy_globals, to_plain
from pc_megatron.errors import ModelFileError
from pc_megatron.files import atomic_write_text


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")


def copy_hf_side_files(src: Path, dst: Path) -> None:
    """Copy an HF folder's files other than weights (config, tokenizer, generation config)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(f, dst / f.name)


def save_checkpoint(
    ckpt_root: Path, step: int, state: dict, keep_last: int, hf_side: Path | None = None, learner=None
) -> Path:
    """``learner``: saved to ``step_N/learner/`` (``Learner.save``). ``hf_side``: an HF folder
    whose config and tokenizer files go to ``step_N/hf/``, so that ``pc-megatron convert --to
    hf`` can turn the checkpoint into an HF model on its own."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = ckpt_root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if learner is not None:
        learner.save(tmp / "learner")
    with open(tmp / "state.pt", "wb") as f:
        torch.save(to_plain({**state, "rng": rng_state()}), f)
        f.flush()
        os.fsync(f.fileno())
    if hf_side is not None:
        copy_hf_side_files(hf_side, tmp / "hf")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write_text(ckpt_root / "latest", final.name)
    _rotate(ckpt_root, step, keep_last)
    return final


def _rotate(ckpt_root: Path, step: int, keep_last: int) -> None:
    """Keep the ``keep_last`` newest checkpoints up to ``step`` (the one just written among them).
    Checkpoints of later steps belong to a future the run went back from (``latest`` pointed at an
    older step): they are set aside as ``abandoned-step_N``, never counted, never deleted."""
    complete = sorted((p for p in ckpt_root.glob("step_*") if p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
    for later in (p for p in complete if int(p.name[5:]) > step):
        aside, k = later.with_name(f"abandoned-{later.name}"), 1
        while aside.exists():  # set aside before, by an earlier going back
            k += 1
            aside = later.with_name(f"abandoned-{later.name}.{k}")
        os.replace(later, aside)
    kept = [p for p in complete if int(p.name[5:]) <= step]
    for old in kept[: max(len(kept) - keep_last, 0)]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint folder ``ckpt_root/latest`` names (the newest complete one), or None. ``latest``
    must name a ``step_N`` folder beside it: any other text is refused, never used as a path."""
    latest = ckpt_root / "latest"
    if not latest.is_file():
        return None
    name = latest.read_text().strip()
    if not (name.startswith("step_") and name[5:].isdigit()):
        raise ModelFileError(
            f"{latest} names {name[:80]!r}, not a checkpoint of this folder (step_N): write the name of one of "
            f"{sorted(p.name for p in ckpt_root.glob('step_*') if p.name[5:].isdigit())} into it"
        )
    return ckpt_root / name


def read_state(folder: Path, named_by: Path) -> dict:
    """The state saved beside the learner in the checkpoint ``folder`` (``state.pt``, read as data only);
    ``named_by``: the ``latest`` file that named it, for the error that says it is missing."""
    path = folder / "state.pt"
    if not path.is_file():
        raise ModelFileError(f"{path}: checkpoint named by {named_by} is missing; the run directory was modified")
    try:
        with torch.serialization.safe_globals(legacy_globals()):  # an earlier version's checkpoint, as data
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused a global: a file that would run code
        what = str(e).split("Unsupported global: ")[-1].split(" was not")[0].strip().splitlines()[0][:120]
        raise ModelFileError(
            f"{path}: holds Python objects that loading would run as code ({what}), and a checkpoint is read as "
            "data only; pc-megatron does not write such files: do not load it"
        ) from None
    except Exception as e:  # a truncated or overwritten file: torch's reader names only itself
        detail = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ModelFileError(
            f"{path}: cannot read the checkpoint's loop and scheduler state ({detail}); the file is damaged or "
            "incomplete: resume from an earlier checkpoint (write its folder name into checkpoints/latest)"
        ) from None
    state = from_plain(state)
    if "learner" in state:
        raise ModelFileError(
            f"{folder}: a checkpoint in the earlier format (learner state inside state.pt), which this version "
            "cannot resume; resume it with the pc-megatron version that wrote it, or start a new run directory"
        )
    return state


def export_hf(named_tensors: Iterable[tuple[str, torch.Tensor]], like_dir: Path, out_dir: Path) -> Path:
    """Write an HF model folder: weights from ``named_tensors``, config and tokenizer files
    copied from ``like_dir``. Written to a temporary folder and renamed at the end."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f"{out_dir.name}.{os.getpid()}.tmp")  # concurrent writers do not collide
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_hf_side_files(Path(like_dir), tmp)
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in named_tensors}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir
