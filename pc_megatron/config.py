"""The run config: each component's dataclass composed into one, loaded from a YAML recipe plus
``key=value`` overrides, type-checked by OmegaConf, validated by each component.

An unknown key or a wrongly typed value fails before any work starts with one line naming
the key and the closest valid keys.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from pc_megatron.algo.config import AlgoConfig
from pc_megatron.checkpoint.config import CheckpointConfig
from pc_megatron.data.config import DataConfig
from pc_megatron.errors import ConfigError, not_one_of, positive, threads_or_auto
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.model.config import ModelConfig
from pc_megatron.rewards.config import RewardConfig
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.runtime.config import RayConfig
from pc_megatron.scheduler import SchedulerConfig

RECIPE_DIR = Path(__file__).resolve().parent.parent / "configs"
TRACKERS = ("tensorboard", "wandb", "mlflow")
"""What ``loggers`` may name (``run/trackers.py`` runs them)."""


def check_loggers(loggers: list[str]) -> None:
    """The ``loggers`` list itself: known names, none twice."""
    for name in loggers:
        if name not in TRACKERS:
            raise ConfigError(f"loggers: '{name}' is not one of {', '.join(TRACKERS)}")
    if len(set(loggers)) != len(loggers):
        raise ConfigError(f"loggers: {list(loggers)} names a tracker twice")


@dataclass
class EvalSetConfig:
    """One benchmark of ``eval.sets``."""

    path: str = ""
    """JSONL/Parquet (flat or verl's schema), a save_to_disk folder or hf://datasets/ORG/NAME/FILE."""
    name: str = ""
    """Metric name (``eval/<name>``); empty = the file name without extension."""
    repeats: int = 1
    """Samples per prompt: the accuracy is avg@repeats (e.g. 32 for AIME)."""
    temperature: float | None = None
    """Sampling temperature; empty = eval.temperature."""
    top_p: float = 1.0
    """Nucleus sampling (the recipe validates at temperature 1.0, top-p 0.7)."""
    max_new_tokens: int = 0
    """0 = eval.max_new_tokens (or rollout.max_new_tokens)."""

    @property
    def set_name(self) -> str:
        return self.name or Path(self.path).stem


@dataclass
class EvalConfig:
    """Held-out evaluation."""

    sets: list[EvalSetConfig] = field(default_factory=list)
    """Benchmarks evaluated beside data.eval_path, each logged as ``eval/<name>`` with their
    mean as ``eval/mean``; without data.eval_path, ``eval_accuracy`` is that mean."""

    every_steps: int = 10
    """Evaluate every this many RL steps (and at the start and the end)."""
    num_prompts: int = 0
    """Held-out prompts used; 0 = all."""
    samples_per_prompt: int = 1
    """k: accuracy is the mean over k samples per prompt."""
    temperature: float = 0.0
    """0 = greedy (then k should be 1)."""
    max_new_tokens: int = 0
    """0 = rollout.max_new_tokens."""
    log_samples: int = 4
    """At each evaluation, this many held-out prompts (the first ones, of each set) with their first
    completion, extracted answer and reward go to ``samples.jsonl`` in the run directory (0 = none)."""
    expected: bool = True
    """Also ``eval_expected_accuracy``: the exact expected accuracy of a sample at
    rollout.temperature (no top-p), P(answer + EOS | prompt) from one teacher-forced learner
    pass, over the held-out split plus ``data.synthetic.num_eval_expected`` more held-out
    prompts, family means weighted by the task's mix. Far less noisy than sampled or greedy
    accuracy over a few hundred prompts; ignores other correct spellings (a slight
    under-estimate). Embedded task only."""

    def validate(self) -> None:
        positive("eval.samples_per_prompt", self.samples_per_prompt)
        positive("eval.every_steps", self.every_steps)  # 0 divided the step count mid-run
        if self.log_samples < 0:
            raise ConfigError(f"eval.log_samples must be >= 0 (0 = none), got {self.log_samples}")
        if self.temperature == 0 and self.samples_per_prompt != 1:
            raise ConfigError("eval.samples_per_prompt > 1 needs eval.temperature > 0 (greedy samples are identical)")
        names = []
        for i, s in enumerate(self.sets):
            if not s.path:
                raise ConfigError(f"eval.sets[{i}]: set its path (a JSONL or Parquet file)")
            if s.repeats < 1:
                raise ConfigError(f"eval.sets[{i}].repeats={s.repeats}: must be >= 1")
            temperature = self.temperature if s.temperature is None else s.temperature
            if temperature == 0 and s.repeats > 1:
                raise ConfigError(f"eval.sets[{i}]: repeats > 1 needs a temperature > 0 (greedy samples are identical)")
            if not 0 < s.top_p <= 1:
                raise ConfigError(f"eval.sets[{i}].top_p={s.top_p}: must be in (0, 1]")
            names.append(s.set_name)
        if len(set(names)) < len(names):
            raise ConfigError(f"eval.sets: two sets share a name ({names}); give each a name")


@dataclass
class WarmStartConfig:
    """SFT warm-start on the same learner before RL (cached by its inputs)."""

    enabled: bool = True
    """Run (or reuse) the warm-start; false = start RL from model.path as is."""
    steps: int = 3000
    """SFT optimizer steps."""
    batch_size: int = 64
    """Examples per SFT step."""
    lr: float = 1e-3
    """SFT learning rate (cosine decay to 10%)."""
    data_path: str = ""
    """SFT rows (prompt + answer); empty = the synthetic task's SFT split."""
    cache_dir: str = ""
    """Where warm-starts and generated tasks are cached; empty = $PC_MEGATRON_CACHE or ~/.cache/pc-megatron."""


@dataclass
class RunConfig:
    seed: int = 0
    """Seed of everything run-specific (sampling, initialisation order)."""
    steps: int = 100
    """RL steps (one optimizer update each)."""
    out_dir: str = "runs"
    """Parent folder of run directories."""
    name: str = ""
    """Run directory name; empty = <recipe>-<timestamp>."""
    threads: int | str = "auto"
    """torch intra-op threads of this process and of each learner rank: 'auto' = the cores this
    process may use divided among the processes that compute at the same time (all of them in the
    synchronous loop, where learner and engines take turns; a share each at rollout.max_staleness >= 1;
    pc_megatron/runtime/resources.py), or a number (it then reaches the engines too unless
    rollout.threads is set). Resolved when the run starts; config.yaml's first line says to what."""
    progress: bool = True
    """Show a progress bar."""
    runtime: Literal["local", "ray"] = "local"
    """'local' (one process, no Ray: the CPU default) or 'ray' (learner ranks and engine replicas
    as Ray actors, one node or many; see `ray.*`)."""
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where each metric row and each evaluation's samples also go (metrics.jsonl always): any of
    tensorboard, wandb, mlflow (the last two: the `trackers` extra; their settings from their own
    environment variables, WANDB_MODE, MLFLOW_TRACKING_URI, ...)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ray: RayConfig = field(default_factory=RayConfig)


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        if isinstance(f.default_factory, type) and is_dataclass(f.default_factory):
            out.extend(_leaf_keys(f.default_factory, key + "."))  # type: ignore[arg-type]
        else:
            out.append(key)
    return out


def _closest(key: str) -> str:
    keys = _leaf_keys(RunConfig)
    near = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
    if not near:  # try the last component alone, anywhere in the tree
        last = key.rsplit(".", 1)[-1]
        near = [k for k in keys if difflib.get_close_matches(last, [k.rsplit(".", 1)[-1]], cutoff=0.7)][:3]
    return f"; did you mean {', '.join(near)}?" if near else "; see `pc-megatron config show` for valid keys"


def _choices(owner: Any, key: Any) -> tuple:
    """The allowed values of field ``key`` of dataclass ``owner`` when it is a ``Literal``, else ()."""
    if not (isinstance(owner, type) and is_dataclass(owner) and isinstance(key, str)):
        return ()
    hint = get_type_hints(owner).get(key)
    return get_args(hint) if get_origin(hint) is Literal else ()


def _friendly(e: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(e, "full_key", None) or "?"
    if isinstance(e, ConfigKeyError):
        return ConfigError(f"{source}: unknown config key '{key}'{_closest(key)}")
    if isinstance(e, ValidationError):
        choices = _choices(e.object_type, e.key) or _choices(e.ref_type, e.key)
        if choices:  # the message each component's own check gave when choices were plain strings
            return ConfigError(not_one_of(key, e.value, choices))
        msg = str(e).splitlines()[0]
        return ConfigError(f"{source}: bad value for '{key}': {msg}")
    return ConfigError(f"{source}: {str(e).splitlines()[0]}")


def recipe_path(recipe: str) -> Path:
    p = Path(recipe)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    candidate = RECIPE_DIR / f"{recipe}.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(x.stem for x in RECIPE_DIR.glob("*.yaml"))
    raise ConfigError(f"recipe '{recipe}' not found: pass a YAML path or one of {known}")


def _recipe_chain(path: Path) -> list[Path]:
    """``path`` after the recipes it inherits from (``inherit: NAME``, a recipe name or a path
    relative to the file), the most basic first: a twin recipe states only what differs."""
    chain = [path]
    while True:
        parent = _load_yaml(chain[0]).get("inherit")
        if not parent:
            return chain
        rel = chain[0].parent / str(parent)
        found = rel if rel.suffix in (".yaml", ".yml") and rel.is_file() else recipe_path(str(parent))
        if found in chain:
            raise ConfigError(f"{chain[0]}: 'inherit: {parent}' makes a cycle of recipes")
        chain.insert(0, found)


def _load_yaml(path: Path):
    """A recipe file, or one ConfigError naming the file, line and column of a YAML mistake."""
    import yaml

    try:
        return OmegaConf.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem}); fix the recipe file") from None


def _without_inherit(node):
    node.pop("inherit", None)
    return node


def _merged(recipe: str | None, overrides: list[str] | tuple[str, ...]) -> Any:
    """The schema with the recipe chain and the overrides merged on, type-checked (not validated)."""
    cfg = OmegaConf.structured(RunConfig)
    if recipe:
        for path in _recipe_chain(recipe_path(recipe)):
            try:
                cfg = OmegaConf.merge(cfg, _without_inherit(_load_yaml(path)))
            except OmegaConfBaseException as e:
                raise _friendly(e, str(path)) from None
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value (e.g. learner.lr=1e-4)")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as e:
            raise _friendly(e, f"override '{item}'") from None
    return cfg


def load_config(recipe: str | None = "tiny", overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The resolved, validated run config: a recipe (a name in configs/ or a YAML path, with the
    recipes it inherits) and ``key=value`` overrides, each section checked by its owner."""
    cfg: RunConfig = OmegaConf.to_object(_merged(recipe, overrides))
    validate(cfg)
    return cfg


def read_run_config(path: str | Path) -> RunConfig:
    """A run's saved ``config.yaml`` as it is, type-checked but not validated (its files may live on
    another machine): for reading a finished run's settings."""
    return OmegaConf.to_object(_merged(str(path), ()))


def validate(cfg: RunConfig) -> None:
    """Each section validates itself; what spans sections is checked here."""
    positive("steps", cfg.steps)
    if cfg.name in (".", "..") or "/" in cfg.name or "\\" in cfg.name or cfg.name.startswith("~"):
        raise ConfigError(
            f"name={cfg.name!r}: a run's folder name inside out_dir (no '/', '..' or absolute path); "
            "set out_dir for where runs go"
        )
    threads_or_auto("threads", cfg.threads)
    threads_or_auto("rollout.threads", cfg.rollout.threads)
    check_loggers(cfg.loggers)
    for section in (cfg.algo, cfg.eval, cfg.data, cfg.model, cfg.checkpoint, cfg.ray, cfg.learner, cfg.rollout):
        section.validate()
    if cfg.data.train_path and not cfg.data.eval_path and not cfg.eval.sets:
        train = Path(cfg.data.train_path)  # the first thing to fix (recipes may name files elsewhere)
        if not cfg.data.train_path.startswith("hf://") and not (train.is_file() or train.is_dir()):
            raise ConfigError(
                f"data.train_path={cfg.data.train_path}: no such file (JSONL or Parquet prompt rows, a save_to_disk "
                "folder, or hf://datasets/ORG/NAME/FILE)"
            )
        raise ConfigError(
            "data.train_path needs held-out data: set data.eval_path or eval.sets (held-out accuracy needs one)"
        )
    check_runtime(cfg)
    if cfg.rollout.inflight == "keep" and not (
        cfg.rollout.max_staleness and cfg.runtime == "local" and cfg.rollout.backend == "vllm"
    ):
        raise ConfigError(
            "rollout.inflight=keep lets a weight update reach requests in flight: it needs rollout.max_staleness "
            ">= 1 (else nothing generates during an update) with runtime=local and rollout.backend=vllm (a Ray "
            "engine actor serves one call at a time, so an update cannot reach it mid-call: use drain there)"
        )
    if cfg.rollout.max_staleness and cfg.runtime == "ray" and cfg.ray.placement == "colocated":
        raise ConfigError(
            f"rollout.max_staleness={cfg.rollout.max_staleness} makes batches while the learner trains: the engines "
            "need devices of their own, set ray.placement=split (colocated engines sleep while the learner trains)"
        )
    cfg.reward.validate()
    cfg.scheduler.validate()
    if cfg.scheduler.pilot_samples >= cfg.algo.samples_per_prompt:
        raise ConfigError("scheduler.pilot_samples must be < algo.samples_per_prompt (the rest are committed)")


def leaf_values(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config (a dataclass or a dict) as ``dotted.key -> value`` (lists as values)."""
    node = asdict(cfg) if is_dataclass(cfg) else cfg
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out |= leaf_values(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def to_yaml(cfg: RunConfig) -> str:
    """The config as a recipe: ``load_config`` of this text gives ``cfg`` back."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def check_runtime(cfg: RunConfig) -> None:
    """What ``runtime`` allows that the config alone shows: its choice, and that ``local`` (one process)
    has nothing to broadcast to. (One process holds one learner rank and one engine: refused in
    ``run/setup.py``'s preflight, after the model's layout, which is the first thing to fix.)"""
    if cfg.runtime not in ("local", "ray"):  # the root's one choice (sections check their own)
        raise ConfigError(f"runtime: '{cfg.runtime}' is not one of local, ray")
    if cfg.runtime == "local" and cfg.rollout.weight_sync.transport == "broadcast":
        raise ConfigError(
            "rollout.weight_sync.transport=broadcast needs runtime=ray (it sends from the learner to engines "
            "in other processes); with runtime=local use auto"
        )
    t = cfg.learner.distributed_timeout_s
    if cfg.runtime == "ray" and cfg.learner.world_size > 1 and 0 < t <= cfg.rollout.timeout_s:
        raise ConfigError(
            f"learner.distributed_timeout_s={t:g} is not above rollout.timeout_s={cfg.rollout.timeout_s:g}: in a "
            "weight sync the learner's other ranks wait in a collective while rank 0 waits on an engine, and they "
            "would time out first, hiding which engine was slow; raise it (or 0: rollout.timeout_s + 600)"
        )
