"""The import rules of docs/ARCHITECTURE.md, checked on the source: they keep the layers apart
as the runtime grows (a vLLM import outside rollout/vllm* would make every CPU test need vLLM)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def offenders(top: str, allowed: tuple[str, ...], folders: tuple[str, ...] = ("pc_megatron", "kernels")) -> list[str]:
    bad = []
    for folder in folders:
        for f in sorted((ROOT / folder).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            if rel.startswith(allowed):
                continue
            if any(m == top or m.startswith(top + ".") for m in imports(f)):
                bad.append(rel)
    return bad


def test_only_the_vllm_rollout_modules_import_vllm():
    assert offenders("vllm", ("pc_megatron/rollout/vllm",)) == []


def test_only_learner_checkpoint_and_compat_import_megatron():
    allowed = ("pc_megatron/learner/", "pc_megatron/checkpoint", "pc_megatron/compat/")
    assert offenders("megatron", allowed) == []


def test_kernels_import_nothing_from_the_package():
    assert offenders("pc_megatron", ("pc_megatron/",), folders=("kernels",)) == []


def test_the_scheduler_imports_no_model_code():
    for module in ("torch", "transformers", "megatron", "vllm"):
        assert [f for f in offenders(module, ()) if f.startswith("pc_megatron/scheduler/")] == []


def test_rewards_import_no_model_code():
    """Reward workers start as fresh processes per pool and per replaced worker: they must not
    pay for torch or a model library."""
    for module in ("torch", "transformers", "megatron", "vllm", "ray"):
        assert [f for f in offenders(module, ()) if f.startswith("pc_megatron/rewards/")] == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at the top or inside a function: a function's import
    runs too, and a circle through one is still a circle for whoever reads or moves the code)."""
    files = {_module_name(f): f for f in sorted((ROOT / "pc_megatron").rglob("*.py"))}
    graph = {}
    for name, f in files.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import mod`` imports the submodule when there is one
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in files and t != name}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_import_graph_has_no_cycle():
    found = cycles(package_graph())
    assert found == [], f"import circles: {found}"


def test_the_cycle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_sees_the_package_imports():
    """A positive control: the graph the cycle check reads holds arrows we know exist, top-level and
    inside functions (an empty or partial graph would pass the cycle check vacuously)."""
    graph = package_graph()
    assert len(graph) > 80
    assert {"pc_megatron.scheduler", "pc_megatron.runtime.roles", "pc_megatron.config"} <= graph["pc_megatron.train"]
    assert "pc_megatron.train" in graph["pc_megatron.commands.train"]  # imported inside run()


def test_only_the_config_loader_imports_omegaconf():
    """The run config is a typed dataclass tree everywhere but in its loader."""
    assert offenders("omegaconf", ("pc_megatron/config.py",)) == []


def test_the_config_loads_without_torch_megatron_or_vllm():
    """``pc-megatron config``, ``plan`` and a bad key's error are config work: loading and validating a
    recipe imports no model library (each section lives in its package's light ``config.py``)."""
    code = (
        "import sys; from pc_megatron.config import load_config; load_config('smollm2-arith', []); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'vllm', 'transformers'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_layers_below_the_learner_do_not_import_it():
    """Wire types live below the learner (``pc_megatron/batch.py``): the rollout side, the scheduler,
    the RL math, the data, the rewards and the weight transport never reach up into it."""
    below = ("rollout", "scheduler", "algo", "data", "rewards", "weight_sync")
    graph = package_graph()
    reach = {
        m: sorted(d for d in deps if d.startswith("pc_megatron.learner"))
        for m, deps in graph.items()
        if m.split(".")[1:2] and m.split(".")[1] in below
    }
    assert {m: d for m, d in reach.items() if d} == {}


def test_no_module_outgrows_a_reading():
    """Files stay small enough to hold in one's head; the CLI stays a dispatcher."""
    sizes = {
        f.relative_to(ROOT).as_posix(): len(f.read_text().splitlines()) for f in (ROOT / "pc_megatron").rglob("*.py")
    }
    assert {f: n for f, n in sizes.items() if n > 450} == {}
    assert sizes["pc_megatron/cli.py"] < 120


def test_the_run_has_one_owner_and_the_loop_keeps_its_verbs():
    """The top of the house stays small: the loop file holds the verbs (its setup, folder, state and
    logs are ``run/``'s), the package's top level a handful of modules, and no function of the loop or
    of ``run/`` grows past a screen or a handful of parameters."""
    top = sorted(p.name for p in (ROOT / "pc_megatron").glob("*.py"))
    assert len(top) <= 13, top
    assert len((ROOT / "pc_megatron" / "train.py").read_text().splitlines()) <= 200
    files = [ROOT / "pc_megatron" / "train.py", *sorted((ROOT / "pc_megatron" / "run").glob("*.py"))]
    too_big = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                params = (
                    len(a.posonlyargs)
                    + len(a.args)
                    + len(a.kwonlyargs)
                    - (a.args[:1] != [] and a.args[0].arg == "self")
                )
                lines = node.end_lineno - node.lineno + 1
                if lines > 60 or params > 8:
                    too_big.append(f"{f.name}:{node.name} ({lines} lines, {params} parameters)")
    assert too_big == []


def test_the_engines_surface_is_typed_not_forwarded():
    """What the loop calls on the engines is written out (``rollout/fleet.py``), so a reader and a type
    checker see it: no ``__getattr__`` forwarding in ``rollout/`` or ``runtime/``."""
    found = []
    for folder in ("rollout", "runtime"):
        for f in sorted((ROOT / "pc_megatron" / folder).glob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                    found.append(f"{folder}/{f.name}")
    assert found == []
