"""Bad input and faults, tried as a user would: each probe runs one ``pc-megatron`` command in a fresh
process and is judged on what a user sees.

A probe passes when the command exits non-zero (or zero where that is right) within its deadline, its
error output is at most ``MAX_LINES`` lines with no Python traceback, the text matches what the probe
expects (the problem named, and where there is one, the fix), and no run folder is left behind by a run
that never started. Signals, dead workers and hanging rewards need a run in flight: those are tests
(named in the table) rather than probes here.

    python tools/fault_probes.py --out /tmp/probes        # ~4 minutes on two cores; prints a Markdown table

The finished run the resume probes need is a 2-step tiny run made first (about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MAX_LINES = 4


@dataclass
class Probe:
    area: str
    name: str
    args: list[str]
    expect: str  # a regular expression the combined output must match
    rc: int | None = None  # the exit status wanted; None = any non-zero
    timeout_s: float = 120.0
    runs_dir: Path | None = None  # a folder that must hold no new run afterwards
    absent: Path | None = None  # a file that must not exist afterwards (what a crafted checkpoint would write)
    env: dict[str, str | None] | None = None  # variables set (None: removed) for the command
    holder: Path | None = None  # a run folder another process holds (its run.lock) while the command runs


def probes(work: Path, run: Path) -> list[Probe]:
    d = work / "inputs"
    d.mkdir(parents=True, exist_ok=True)
    (d / "bad.yaml").write_text("steps: 3\n  learner:\n lr: 1\n")
    (d / "good.jsonl").write_text(
        "".join(json.dumps({"id": i, "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8))
    )
    (d / "broken.jsonl").write_text('{"id": 0, "prompt": "1+1=", "answer": "2"}\n{"id": 1, "prompt": \n')
    (d / "noanswer.jsonl").write_text('{"id": 0, "prompt": "1+1="}\n')
    (d / "empty.jsonl").write_text("")
    (d / "dupes.jsonl").write_text('{"id": 0, "prompt": "a", "answer": "1"}\n{"id": 0, "prompt": "b", "answer": "2"}\n')
    (d / "completions.jsonl").write_text(
        '{"id": 0, "completion": "\\\\boxed{2}", "answer": "2"}\n{"id": 1, "completion": "x"}\n'
    )
    (d / "scored.jsonl").write_text('{"id": 0, "completion": "\\\\boxed{2}", "answer": "2"}\n')
    (d / "hf_like").mkdir(exist_ok=True)
    (d / "hf_like" / "config.json").write_text(
        json.dumps({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"})
    )
    runs = work / "runs"
    runs.mkdir(exist_ok=True)
    t = ["train", "tiny", f"out_dir={runs}", "progress=false"]
    data = [f"data.eval_path={d / 'good.jsonl'}"]

    def train(name, extra, expect, area="config", **kw):
        return Probe(area, name, t + extra, expect, runs_dir=runs, **kw)

    def unsafe(name, copy, expect, **kw):  # a resume of one of unsafe_copies' folders
        return Probe("safety", name, ["train", "--resume", str(work / copy), "steps=3"], expect, **kw)

    return [
        train("unknown key", ["learner.lrr=1"], r"unknown config key 'learner\.lrr'; did you mean learner\.lr"),
        train("wrong type", ["steps=abc"], r"steps.*abc"),
        Probe(
            "config", "unknown recipe", ["train", "nosuch"], r"recipe 'nosuch' not found: pass a YAML path or one of"
        ),
        Probe("config", "malformed YAML recipe", ["train", str(d / "bad.yaml")], r"bad\.yaml:\d+"),
        train("unknown policy", ["scheduler.policy=foo"], r"scheduler\.policy.*(grpo|pilot_commit)"),
        train("zero samples", ["algo.samples_per_prompt=0"], r"samples_per_prompt"),
        train("TP 3 on local runtime", ["learner.tensor_parallel_size=3"], r"(divide|heads)"),
        train("TP that does not divide the KV heads, ray", ["runtime=ray", "learner.tensor_parallel_size=4"], r"heads"),
        train("model.path missing", ["model.path=/nonexistent/model"], r"/nonexistent/model"),
        train(
            "model.path and model.fixture", ["model.path=/x", "model.fixture=smollm2-135m-instruct"], r"set one of them"
        ),
        train("unknown fixture", ["model.fixture=gpt-17"], r"unknown fixture"),
        train("unsupported architecture", [f"model.path={d / 'hf_like'}"], r"(Mixtral|mixtral)"),
        train("train file missing", ["data.train_path=/nonexistent.jsonl", *data], r"/nonexistent\.jsonl", area="data"),
        train("train file without eval file", [f"data.train_path={d / 'good.jsonl'}"], r"eval_path", area="data"),
        train("malformed JSONL row", [f"data.train_path={d / 'broken.jsonl'}", *data], r"broken\.jsonl:2", area="data"),
        train(
            "row without answer",
            [f"data.train_path={d / 'noanswer.jsonl'}", *data],
            r"noanswer\.jsonl:1.*answer",
            area="data",
        ),
        train(
            "empty dataset",
            [f"data.train_path={d / 'empty.jsonl'}", *data],
            r"empty\.jsonl.*(no rows|empty)",
            area="data",
        ),
        train(
            "duplicate ids",
            [f"data.train_path={d / 'dupes.jsonl'}", *data],
            r"dupes\.jsonl: row 2 repeats id",
            area="data",
        ),
        train("unknown generator", ["data.generator=poems"], r"generator", area="data"),
        train("reward function that does not import", ["reward.function=no_such_mod:f"], r"no_such_mod", area="reward"),
        train("unknown reward", ["reward.name=bleu"], r"reward\.name.*(integer_match|math_verify)", area="reward"),
        Probe("score", "file missing", ["score", "/nonexistent.jsonl"], r"/nonexistent\.jsonl"),
        Probe("score", "row without answer", ["score", str(d / "completions.jsonl")], r"completions\.jsonl:2.*answer"),
        Probe("score", "unknown reward", ["score", str(d / "scored.jsonl"), "--reward", "bleu"], r"bleu"),
        Probe(
            "convert", "source missing", ["convert", "--to", "hf", "/nonexistent", str(work / "o1")], r"/nonexistent"
        ),
        Probe("convert", "output exists", ["convert", "--to", "hf", str(run), str(d)], r"exists"),
        Probe(
            "convert",
            "TP that does not divide",
            ["convert", "--to", "megatron", str(latest_step(run) / "hf"), str(work / "o2"), "--tp", "3"],
            r"(divide|config\.json|model)",
        ),
        Probe("plan", "the tiny recipe", ["plan", "tiny"], r"needs no plan"),
        Probe(
            "plan",
            "layout that cannot be placed",
            ["plan", "polaris-14b", "learner.tensor_parallel_size=3"],
            r"(divide|heads)",
        ),
        Probe("resume", "run folder missing", ["train", "--resume", "/nonexistent/run"], r"/nonexistent/run"),
        Probe(
            "resume",
            "an override the record cannot hold",
            ["train", "--resume", str(run), "algo.samples_per_prompt=16"],
            r"cannot change algo\.samples_per_prompt",
        ),
        Probe("resume", "a finished run", ["train", "--resume", str(run)], r"(finished|complete)", rc=0),
        Probe(
            "resume",
            "state.pt damaged",
            ["train", "--resume", str(work / "damaged_state"), "steps=3"],
            r"state\.pt.*latest",
        ),
        Probe(
            "resume",
            "learner shard damaged",
            ["train", "--resume", str(work / "damaged_shard"), "steps=3"],
            r"(learner|shard).*latest",
        ),
        Probe(
            "resume",
            "a checkpoint of another model",
            ["train", "--resume", str(run), "model.tiny.hidden_size=96"],
            r"model\.tiny\.hidden_size",
        ),
        train("keep_last=0", ["checkpoint.keep_last=0"], r"keep_last=0: keep at least 1", area="safety"),
        unsafe("config.yaml emptied", "emptied", r"emptied/config\.yaml is empty.*restore it"),
        unsafe("config.yaml edited by hand", "edited", r"other inputs than the steps already taken.*seed: 0 -> 5"),
        unsafe(
            "state.pt that runs code when unpickled",
            "crafted",
            r"state\.pt: holds Python objects that loading would run as code",
            absent=work / "crafted-ran",
        ),
        unsafe(
            "learner .metadata that runs code when unpickled",
            "crafted_meta",
            r"learner/\.metadata: holds Python objects that loading would run as code",
            absent=work / "crafted-meta-ran",
        ),
        Probe(
            "safety",
            "convert --to hf of a checkpoint whose .metadata runs code",
            ["convert", "--to", "hf", str(work / "crafted_meta"), str(work / "crafted_out")],
            r"\.metadata: holds Python objects that loading would run as code",
            absent=work / "crafted-meta-ran",
        ),
        unsafe("state.pt of a newer version", "newer", r"state\.pt: written by another version of pc-megatron"),
        train("name= outside out_dir", ["name=../escape"], r"a run's folder name inside out_dir", area="safety"),
        Probe(
            "safety",
            "tracker address with credentials that does not answer",
            [*t, "loggers=[mlflow]"],
            r"MLFLOW_TRACKING_URI=http://\*\*\*@127\.0\.0\.1:1 does not answer",
            runs_dir=runs,
            env={"MLFLOW_TRACKING_URI": "http://alice:hunter2@127.0.0.1:1"},
        ),
        unsafe("latest names a path", "latest_path", r"names '\.\./\.\./outside', not a checkpoint of this folder"),
        unsafe("a second run in a folder in use", "held", r"held is in use by pid \d+", holder=work / "held"),
        Probe(
            "safety",
            "joining a cluster without its token",
            [*t, "runtime=ray", "ray.address=127.0.0.1:PORT"],
            r"needs the cluster's token: export RAY_AUTH_TOKEN",
            runs_dir=runs,
            env={"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": None},
        ),
        Probe(
            "ray",
            "cluster address that does not answer",
            ["train", "tiny", f"out_dir={runs}", "runtime=ray", "ray.address=127.0.0.1:1", "ray.connect_timeout_s=10"],
            r"127\.0\.0\.1:1.*ray start --head",
            timeout_s=60,
            runs_dir=runs,
        ),
    ]


def damaged_copies(run: Path, work: Path) -> None:
    """Two copies of the finished run, one with its state file cut short, one with a learner shard."""
    for name in ("damaged_state", "damaged_shard"):
        dst = work / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(run, dst, symlinks=True)
    state = latest_step(work / "damaged_state") / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    shard = sorted((latest_step(work / "damaged_shard") / "learner").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])


class _WritesAFile:
    """What a crafted checkpoint holds: unpickling it calls ``Path.write_text``."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (self.target, "ran"))


def unsafe_copies(run: Path, work: Path) -> None:
    """Copies of the finished run with one thing a user, a disk or an attacker got wrong each."""
    import torch

    for name in ("emptied", "edited", "crafted", "crafted_meta", "newer", "latest_path", "held"):
        dst = work / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(run, dst, symlinks=True)
        (dst / "summary.json").unlink(missing_ok=True)  # not finished: the resume goes on to its checks
        (dst / "run.lock").unlink(missing_ok=True)
    (work / "emptied" / "config.yaml").write_text("")
    edited = work / "edited" / "config.yaml"
    edited.write_text(edited.read_text().replace("seed: 0", "seed: 5", 1))
    (work / "crafted-ran").unlink(missing_ok=True)
    crafted = {"loop": {"step": 2}, "scheduler": _WritesAFile(work / "crafted-ran")}
    torch.save(crafted, latest_step(work / "crafted") / "state.pt")
    (work / "latest_path" / "checkpoints" / "latest").write_text("../../outside")
    (work / "crafted-meta-ran").unlink(missing_ok=True)
    meta = latest_step(work / "crafted_meta") / "learner" / ".metadata"
    meta.write_bytes(pickle.dumps(_WritesAFile(work / "crafted-meta-ran")))
    newer = latest_step(work / "newer") / "state.pt"
    state = torch.load(newer, weights_only=False)
    state["loop"]["tokens_seen"] = 0  # a field a later version added
    torch.save(state, newer)


def latest_step(run: Path) -> Path:
    """The checkpoint folder a run's ``checkpoints/latest`` names."""
    from pc_megatron.checkpoint.store import latest_checkpoint

    return latest_checkpoint(run / "checkpoints")


def judge(p: Probe, rc: int, out: str, seconds: float, left: list[str]) -> tuple[bool, str]:
    lines, after_warning = [], False
    for ln in out.strip().splitlines():  # libraries' warnings (and the source line Python shows under one) are not ours
        warning = "WARNING" in ln or "Warning:" in ln or ln.startswith("warning:")
        if ln.strip() and not warning and not (after_warning and ln.startswith(" ")):
            lines.append(ln)
        after_warning = warning or (after_warning and ln.startswith(" "))
    why = []
    if rc == -9:
        why.append(f"killed after {p.timeout_s:.0f} s")
    elif p.rc is None and rc == 0:
        why.append("exit 0")
    elif p.rc is not None and rc != p.rc:
        why.append(f"exit {rc}")
    if "Traceback" in out:
        why.append("traceback")
    if len(lines) > MAX_LINES and p.rc is None:
        why.append(f"{len(lines)} lines")
    if not re.search(p.expect, out, re.S):
        why.append(f"no /{p.expect}/")
    if left:
        why.append(f"left {', '.join(left)}")
    return not why, "; ".join(why)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="run only the probes whose name contains this")
    args = ap.parse_args()
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    run = work / "finished"
    if not (run / "summary.json").is_file():
        subprocess.run(
            [
                "pc-megatron",
                "train",
                "tiny",
                "steps=2",
                "eval.every_steps=2",
                "checkpoint.every_steps=1",
                f"out_dir={work}",
                "name=finished",
                "progress=false",
            ],
            check=True,
            capture_output=True,
        )
    damaged_copies(run, work)
    unsafe_copies(run, work)
    listener = socket.socket()  # answers a TCP connection as a cluster head would, for the token probe
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = str(listener.getsockname()[1])
    rows = []
    for p in probes(work, run):
        if args.only and args.only not in p.name:
            continue
        before = set(os.listdir(p.runs_dir)) if p.runs_dir else set()
        env = dict(os.environ)
        for k, v in (p.env or {}).items():
            env.pop(k, None) if v is None else env.__setitem__(k, v)
        holder = None
        if p.holder is not None:  # another run holding the folder: the lock a run takes, held by a process
            code = "import sys,time; from pathlib import Path; from pc_megatron.run.folder import claim_run_dir; "
            code += "c = claim_run_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
            holder = subprocess.Popen([sys.executable, "-c", code, str(p.holder)], stdout=subprocess.PIPE, text=True)
            holder.stdout.readline()
        t0 = time.monotonic()
        try:
            args_ = [a.replace("PORT", port) for a in p.args]
            cp = subprocess.run(["pc-megatron", *args_], capture_output=True, text=True, timeout=p.timeout_s, env=env)
            rc, out = cp.returncode, cp.stdout + cp.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = -9, (e.stdout or b"").decode() + (e.stderr or b"").decode()
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
        seconds = time.monotonic() - t0
        left = sorted(set(os.listdir(p.runs_dir)) - before) if p.runs_dir else []
        if p.absent is not None and p.absent.exists():
            left.append(str(p.absent))
        ok, why = judge(p, rc, out, seconds, left)
        last = next((ln for ln in reversed(out.strip().splitlines()) if ln.strip()), "")
        rows.append((p, ok, why, rc, seconds, last))
        print(f"{'ok ' if ok else 'BAD'} {p.area:8s} {p.name}: exit {rc}, {seconds:.1f} s: {last[:160]}", flush=True)
    print("\n| area | probe | verdict | exit | s | what the user reads (last line) |\n|---|---|---|---|---|---|")
    for p, ok, why, rc, seconds, last in rows:
        last = last.replace("|", "\\|")[:200]
        print(f"| {p.area} | {p.name} | {'ok' if ok else 'FAILS: ' + why} | {rc} | {seconds:.1f} | `{last}` |")
    bad = sum(not r[1] for r in rows)
    print(f"\n{len(rows) - bad} of {len(rows)} probes hold")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
