#!/usr/bin/env bash
# The wheels the lent GPU machine's image lacks (it has torch, Triton, transformers, numpy, pytest and
# no registry; docs/LOG.md), built here from a clean checkout into .whl/ (git-ignored), at the versions
# of constraints.txt, for its Python 3.12 on x86_64. tools/device_check.sh installs them; the device
# call carries them: run(command="bash tools/device_check.sh", carry=[".whl"]).
#
#   bash tools/device_wheels.sh            # then check: du -sh .whl (the carry limit is 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -i "^$1==" constraints.txt | head -1; }
rm -rf .whl && mkdir -p .whl
# binary wheels for the device's interpreter (not this machine's)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    "$(pin megatron-core)" "$(pin omegaconf)" "$(pin psutil)" "$(pin hypothesis)" "$(pin sortedcontainers)"
# antlr4's runtime 4.9.3 (omegaconf's grammar) is published as a source archive only: a pure wheel
python3 -m pip wheel -q --no-deps -w .whl "$(pin antlr4-python3-runtime)"
ls -1 .whl
du -sh .whl
