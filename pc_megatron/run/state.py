"""What a checkpoint saves and a resume restores, in one place.

The run's stateful parts, saved together at a checkpoint and restored together on ``--resume``:

    learner     its own folder in the checkpoint (``Learner.save``: a distributed checkpoint)
    scheduler   as it was when the checkpointed step's batch was made (batches made ahead are made again)
    loop        ``LoopState``: the step, the wall time, the last held-out accuracy, the update versions
    rng         torch, numpy and Python
    fingerprint the run's inputs, compared on a resume (``folder.py``)

and beside them the run folder's row logs (``metrics.jsonl``, ``trained.jsonl``, ``samples.jsonl``: rows
of steps after the checkpoint are dropped) and the trackers' run ids (``trackers.json``: a resumed run
goes on logging into the same tracker runs). The file format is ``checkpoint/store.py``'s.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pc_megatron.checkpoint.store import latest_checkpoint, read_state, save_checkpoint, set_rng_state
from pc_megatron.errors import ModelFileError
from pc_megatron.files import atomic_write_text
from pc_megatron.run.folder import check_resume

TRACKERS_FILE = "trackers.json"


@dataclass
class LoopState:
    """What the loop itself carries across a checkpoint (the parts own the rest)."""

    step: int = 0
    wall_s: float = 0.0
    last_eval_accuracy: float = float("nan")
    update_versions: list[int] = field(default_factory=list)
    """The learner's version after each update so far: a sample's staleness is how many of them lie
    between its weights and the ones it trains (``rollout.producer.staleness_metrics``)."""


def load_latest(ckpt_root: Path) -> tuple[dict, Path] | None:
    """``(state, checkpoint folder)`` of the newest complete checkpoint, or None."""
    folder = latest_checkpoint(ckpt_root)
    return None if folder is None else (read_state(folder, ckpt_root / "latest"), folder)


class RunState:
    """The run's state across checkpoints: found (and checked against ``fingerprint``) before any
    process starts, restored into the parts once they exist, saved at each checkpoint."""

    def __init__(self, run_dir: Path, fingerprint: dict[str, Any], resume: bool) -> None:
        self.root = run_dir / "checkpoints"
        self.fingerprint = fingerprint
        self.found = load_latest(self.root) if resume else None
        if self.found is not None:
            check_resume(self.found[0].get("fingerprint"), fingerprint, str(self.found[1]))
        self.loop = _loop_state(*self.found) if self.found is not None else LoopState()
        if self.found is not None and (self.found[1] / "learner").is_dir():
            from pc_megatron.learner.data_only import check_data_only

            check_data_only(self.found[1] / "learner")  # before any process starts (the learner loads it later)

    @property
    def resume_step(self) -> int:
        """The checkpoint's step on a resume, -1 on a fresh start: rows of later steps are redone."""
        return self.loop.step if self.found is not None else -1

    def restore(self, learner, scheduler) -> None:
        """The learner, the scheduler and the rng as the checkpoint left them (nothing on a fresh start)."""
        if self.found is None:
            return
        state, path = self.found
        learner.load(path / "learner")
        try:
            scheduler.load_state_dict(state["scheduler"])
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError) as e:
            what = f"its scheduler or rng state does not fit this version: {type(e).__name__}: {e}"
            raise _other_version(path, what) from None

    def save(self, scheduler_state: dict, keep_last: int, hf_side: Path, learner) -> Path:
        """A checkpoint of ``self.loop.step``: ``scheduler_state`` is the scheduler as it was when that
        step's batch was made."""
        state = {"scheduler": scheduler_state, "loop": asdict(self.loop), "fingerprint": self.fingerprint}
        return save_checkpoint(self.root, self.loop.step, state, keep_last, hf_side, learner)


def _loop_state(state: dict, folder: Path) -> LoopState:
    saved = state.get("loop", {})
    unknown = sorted(set(saved) - {f.name for f in fields(LoopState)})
    if unknown:
        raise _other_version(folder, f"its loop state holds {unknown}, which this version does not know")
    return LoopState(**saved)


def _other_version(folder: Path, what: str) -> ModelFileError:
    return ModelFileError(
        f"{folder / 'state.pt'}: written by another version of pc-megatron ({what[:200]}); resume it with the "
        "version that wrote it, or start a new run directory"
    )


def keep_rows_through(path: Path, step: int) -> None:
    """Drop the rows of ``path`` (JSONL, a ``step`` each) after ``step``, so that after a resume the file
    reads as if the run had never stopped. The kept rows go to a new file that replaces the old one (a
    kill during the rewrite loses nothing); a torn last line (a kill mid-write) goes with the steps after
    the checkpoint."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if _step_of(line) <= step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a torn line: only a kill mid-write leaves one, after the last checkpoint


def tracker_ids(run_dir: Path, resume_step: int) -> dict[str, dict]:
    """Each tracker's run id and the last step it took, as a resumed run left them (empty when fresh)."""
    path = run_dir / TRACKERS_FILE
    return json.loads(path.read_text()) if resume_step >= 0 and path.exists() else {}


def save_tracker_ids(run_dir: Path, ids: dict[str, dict]) -> None:
    atomic_write_text(run_dir / TRACKERS_FILE, json.dumps(ids, indent=1))
