"""The run folder: who holds it, what it was started with, and what a resume may change.

- **The claim.** ``run.lock`` (an exclusive ``flock``, let go when the process ends, a kill included):
  one run at a time in a folder.
- **config.yaml** (the config as given, under a first comment saying what ``auto`` became) and
  **resumes.jsonl** (each accepted change of a resume, with the step it takes effect after).
- **The resume rules.** A resume takes its config from ``config.yaml`` and may change only the keys
  of ``RESUME_SAFE``; every checkpoint keeps a fingerprint of the run's inputs (the config's other
  keys, the data, the tokenizer), and a resume on other inputs is refused in one line. The
  fingerprint catches what ``config.yaml`` does not show: data files that changed on disk under the
  same names, a tokenizer that changed in the model folder, a ``config.yaml`` edited by hand.

What a checkpoint restores (the learner, the scheduler, the loop, the rng) is ``state.py``'s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pc_megatron.config import RunConfig, leaf_values, load_config, to_yaml
from pc_megatron.data.task import Task, config_hash
from pc_megatron.errors import ConfigError
from pc_megatron.files import atomic_write_text, try_lock

# Keys a resumed run may change: how long it runs, how often it evaluates and saves, where and how wide
# it runs (a checkpoint reshards to another layout; a sample's seed does not depend on the replicas; shared
# prompts compute the same gradients),
# its deadlines. Anything else would make the run's record (config.yaml, the metrics) describe steps
# that ran otherwise.
RESUME_SAFE = (
    "steps",
    "progress",
    "threads",
    "rollout.threads",
    "loggers",
    "runtime",
    "eval.every_steps",
    "checkpoint.",
    "ray.",
    "learner.tensor_parallel_size",
    "learner.pipeline_parallel_size",
    "learner.data_parallel_size",
    "learner.share_prompts",  # the same gradients, laid out otherwise (as a change of layout)
    "rollout.replicas",
    "rollout.timeout_s",
    "learner.distributed_timeout_s",
    "reward.workers",
)


def resume_changes(saved: RunConfig, wanted: RunConfig) -> dict[str, tuple[Any, Any]]:
    """``key -> (saved, wanted)`` for every leaf that differs; a key outside ``RESUME_SAFE`` is one
    ConfigError that names it and the keys a resume may change."""
    before, after = leaf_values(saved), leaf_values(wanted)
    changes = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    unsafe = sorted(k for k in changes if not k.startswith(RESUME_SAFE))
    if unsafe:
        raise ConfigError(
            f"--resume cannot change {', '.join(unsafe)}: the steps already taken ran with "
            f"{', '.join(f'{k}={changes[k][0]}' for k in unsafe)}; start a new run for that (a resume may change "
            f"{', '.join(k.rstrip('.') + ('.*' if k.endswith('.') else '') for k in RESUME_SAFE)})"
        )
    return changes


WHAT = {
    "config": "the config's keys a resume may not change",
    "train_data": "the training prompts and answers",
    "eval_data": "the held-out prompts and answers",
    "tokenizer": "the tokenizer (vocabulary, special tokens, chat template)",
    "tokenization": "how the tokenizer splits text (the ids of a probe text)",
    "weights": "the starting (and reference) weights (their safetensors headers and sizes)",
    "reward": "the reward function's source",
}
PROBE = "Ava has 47 apples; 47 + 28 = 75. The answer is \\boxed{75}.\n  ½ café, ÄÖÜ, 12,345.6 -> 你好 🙂"
"""Text whose ids show how the tokenizer splits (merges, normalisation, pre-tokenisation), which its
vocabulary and special tokens alone do not."""


def _rows(rows) -> list[tuple[str, str, str]]:
    return [(r.id, r.prompt, r.answer) for r in rows]


def tokenizer_digest(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    special = {k: str(v) for k, v in getattr(tokenizer, "special_tokens_map", {}).items()}
    return config_hash([type(tokenizer).__name__, vocab, special, getattr(tokenizer, "chat_template", None)])


def run_fingerprint(cfg: RunConfig, task: Task, tokenizer: Any, policy_dir: Path | None = None) -> dict[str, Any]:
    """The config's fixed keys as they are (a key a later version adds is not a difference), the
    inputs as hashes: data, tokenizer and how it splits text, the starting weights (``policy_dir``), the
    reward function's source."""
    fixed = {k: v for k, v in leaf_values(cfg).items() if not k.startswith(RESUME_SAFE)}
    held_out = [_rows(task.eval), *[(name, _rows(rows)) for name, rows, _ in task.sets]]
    out = {
        "config": json.loads(json.dumps(fixed, default=str)),
        "train_data": f"{len(task.train)} rows, {config_hash(_rows(task.train))}",
        "eval_data": config_hash(held_out),
        "tokenizer": tokenizer_digest(tokenizer),
        "tokenization": config_hash(list(tokenizer.encode(PROBE, add_special_tokens=False))),
    }
    if cfg.reward.function:  # a user's reward (the built-in ones are this version's code, like the rest)
        out["reward"] = reward_digest(cfg.reward.function)
    if policy_dir is not None:
        out["weights"] = weights_digest(Path(policy_dir))
    return out


def weights_digest(folder: Path) -> str:
    """Each safetensors file's name, size and header (every tensor's name, dtype, shape and offsets)."""
    parts = []
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            parts.append([f.name, f.stat().st_size, fh.read(min(n, 100_000_000)).decode("utf-8", "replace")])
    return config_hash(parts)


def reward_digest(function: str) -> str:
    """The source of the module of a user's reward ``module:function``."""
    import importlib.util

    name = function.partition(":")[0]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return config_hash([name, origin.read_text() if origin is not None and origin.is_file() else None])


def check_resume(saved: dict[str, Any] | None, now: dict[str, Any], checkpoint: str) -> None:
    """One ConfigError naming every part that differs from the checkpoint's (``saved`` None: a
    checkpoint written before fingerprints, not checked)."""
    if saved is None:
        return
    parts = []
    was, is_ = saved.get("config", {}), now["config"]
    keys = sorted(k for k in was.keys() & is_.keys() if was[k] != is_[k])
    if keys:
        shown = ", ".join(f"{k}: {was[k]!r} -> {is_[k]!r}" for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
        parts.append(f"{WHAT['config']} ({shown})")
    for k in ("train_data", "eval_data", "tokenizer", "tokenization", "weights", "reward"):
        if k in saved and k in now and saved[k] != now[k]:  # a part a checkpoint predates is not compared
            parts.append(f"{WHAT[k]} ({saved[k]} at the checkpoint, {now[k]} now)")
    if parts:
        raise ConfigError(
            f"--resume from {checkpoint}: this run would continue on other inputs than the steps already taken: "
            f"{'; '.join(parts)}. Put back what the run was started with (data files, model folder, config.yaml), "
            "or start a new run directory"
        )


def claim_run_dir(run_dir: Path) -> IO:
    """Claim ``run_dir`` for this process (an exclusive lock on ``run_dir/run.lock``, released when the
    process ends, a kill included); one ConfigError naming the holder when another process has it:
    two runs in one folder would delete each other's checkpoints in progress. Close the file to let go."""
    f = open(run_dir / "run.lock", "a+")
    try:
        holder = try_lock(f)
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without locks (some NFS and FUSE mounts)
        f.close()
        raise ConfigError(
            f"{run_dir}: its file system cannot lock files ({e.strerror or e}), so two runs in this folder could "
            "not be kept apart; put out_dir on a file system with flock (a local disk, NFSv4, Lustre mounted "
            "with -o flock: docs/CLUSTER.md)"
        ) from None
    if holder is not None:
        f.close()
        raise ConfigError(
            f"{run_dir} is in use by {holder} (its run.lock is held): two runs in one folder would overwrite each "
            "other's checkpoints; wait for it to end, or use another name="
        )
    return f


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of a run's latest checkpoint, or None without one."""
    from pc_megatron.checkpoint.store import latest_checkpoint

    folder = latest_checkpoint(run_dir / "checkpoints")
    return int(folder.name.split("_")[-1]) if folder is not None and folder.name.startswith("step_") else None


@dataclass
class RunFolder:
    """A run's folder and how the run comes to it: fresh (``new``) or resumed (``resumed``)."""

    path: Path
    resume: bool = False
    done: int | None = None
    """The step of the latest checkpoint (a resume)."""
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """The keys a resume changes: ``key -> (saved, wanted)``."""

    @classmethod
    def new(cls, recipe: str, cfg: RunConfig) -> RunFolder:
        """``out_dir/name`` (``name`` empty: ``<recipe>-<timestamp>``) for a fresh run; a folder that
        already holds one is refused."""
        name = cfg.name or f"{Path(recipe).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        path = Path(cfg.out_dir) / name
        if (path / "checkpoints").exists():
            raise ConfigError(f"{path} already holds a run; use --resume {path} or another name=")
        return cls(path)

    @classmethod
    def resumed(cls, run_dir: Path, overrides: list[str]) -> tuple[RunFolder, RunConfig]:
        """The folder of a run to continue and its config: ``config.yaml`` with ``overrides``, which may
        change only ``RESUME_SAFE`` keys."""
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"{run_dir}: not a run directory (no config.yaml); pass the folder a run created")
        if not saved.read_text().strip():
            raise ConfigError(
                f"{saved} is empty (a write cut short): restore it (the run's settings are also in "
                "checkpoints/step_*/; resuming on the default config would train another run)"
            )
        cfg = load_config(str(saved), overrides)
        changes = resume_changes(load_config(str(saved)), cfg)
        return cls(run_dir, True, checkpoint_step(run_dir), changes), cfg

    def complete(self, steps: int) -> bool:
        return self.done is not None and self.done >= steps

    def claim(self) -> IO:
        """The folder is this process's until the returned file is closed (or the process ends)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return claim_run_dir(self.path)

    def accept_resume(self) -> None:
        """Once the checkpoint accepted the resume: its changes logged (``resumes.jsonl``), if any."""
        if self.changes:
            log_resume(self.path, self.done or 0, self.changes)

    def write_config(self, header: str, given: RunConfig) -> None:
        """``config.yaml``: the config as given (``auto`` kept), under ``header``."""
        atomic_write_text(self.path / "config.yaml", header + to_yaml(given))


def log_resume(run_dir: Path, step: int, changes: dict) -> None:
    """Each accepted change of a resume, with the step it takes effect after, in ``resumes.jsonl``
    (``config.yaml`` is rewritten with the new values when the run starts)."""
    entry = {"after_step": step, "changes": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}}
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(f"resuming after step {step} with " + ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changes.items()))
