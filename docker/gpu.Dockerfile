# syntax=docker/dockerfile:1
# GPU image: CUDA 13.0 devel base (Transformer Engine compiles its torch extension against it),
# torch 2.13.0 (CUDA 13.0 build), Transformer Engine, vLLM 0.32, Ray, Megatron-Core; every Python
# package at the version in constraints.txt, the base image at the `# image gpu-base` line there.
#
# NOT BUILT: its CUDA base cannot be fetched on the development machines. What was checked there:
# the file parses (tests/test_images.py, Docker's own parser), and every package it installs
# resolves as pinned for its Python 3.12 / manylinux x86_64 (`bash tools/update_pins.sh --check`, a
# pip dry run for this platform; it found torch's CUDA libraries pinned too new, since fixed).
# On an Ubuntu 24.04 stand-in without CUDA it builds through `pip install torch` (the pinned CUDA
# libraries install). Transformer Engine's torch extension was built with these settings on a stand-in
# for the base (Python 3.12, the CUDA compiler and headers from the pinned NVIDIA wheels) and its import
# passed (docs/LOG.md, "GPU paths, round four"); the real base's headers have not been used.
# Build: docker/build.sh gpu
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_CONSTRAINT=/opt/pc-megatron/constraints.txt \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_VERBOSITY=error

# iproute2: the two-node test's network namespaces; git: Megatron-Core's optional checks; g++:
# Transformer Engine's torch extension (named, not left to what the base happens to hold)
# apt packages: those of the base image's release (DL3008: not pinned; the base tag is)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev g++ git iproute2 \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/venv

WORKDIR /opt/pc-megatron
COPY constraints.txt pyproject.toml README.md ./
# torch first: Transformer Engine's torch extension (33 C++ files compiled by g++, no CUDA sources, no
# prebuilt wheel for this torch) is built against the torch already installed; ninja compiles them in
# parallel (without it: one at a time), numpy quiets torch's extension builder. Each compile peaks at
# ~2.9 GB and the whole extension is ~15 CPU-minutes (measured on a stand-in, docs/LOG.md): MAX_JOBS
# bounds the parallel compiles (raise it on a large builder, `--build-arg MAX_JOBS=8`).
# NVTE_PYTORCH_FORCE_BUILD skips setup.py's probe for a prebuilt wheel on the project's release page.
# cuDNN and NCCL: the build includes <cudnn.h> and <nccl.h> from the venv's wheels (CPATH, ahead of the
# base's /usr/include), and at import TE looks for cuDNN under CUDNN_PATH before the system's
# libcudnn.so: set for good, so torch and TE load the venv's one cuDNN, not the base's beside it.
ARG MAX_JOBS=2
ENV CUDNN_PATH=/opt/venv/lib/python3.12/site-packages/nvidia/cudnn
RUN pip install torch==2.13.0 ninja numpy \
    && CPATH="${CUDNN_PATH}/include:/opt/venv/lib/python3.12/site-packages/nvidia/nccl/include" \
       MAX_JOBS=${MAX_JOBS} NVTE_PYTORCH_FORCE_BUILD=TRUE \
       pip install --no-build-isolation "transformer-engine[pytorch]==2.20.2" \
    && test -d "${CUDNN_PATH}/lib"
# the compiled extension itself must load (importing transformer_engine alone succeeds with a broken one);
# torch first, so that cuDNN and NCCL resolve to the venv's (the extension registers under
# transformer_engine, so it is imported after it); no GPU driver is needed for the import
RUN python -c "import torch, transformer_engine.pytorch, transformer_engine_torch"
COPY pc_megatron ./pc_megatron
COPY kernels ./kernels
COPY configs ./configs
COPY tools ./tools
COPY tests ./tests
COPY docker ./docker
RUN pip install --no-build-isolation -e ".[gpu,test,trackers]" \
    && python -c "import torch, vllm, ray, transformer_engine, megatron.core; print('image ok', torch.__version__, vllm.__version__)"

ENTRYPOINT ["pc-megatron"]
CMD ["train", "tiny"]
