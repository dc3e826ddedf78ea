"""The import rules of docs/ARCHITECTURE.md, checked on the source: they keep the layers apart
as the runtime grows (a vLLM import outside rollout/vllm* would make every CPU test need vLLM)."""

from __future__ import annotations

import ast
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
