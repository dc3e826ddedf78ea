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
# libraries install); Transformer Engine's torch extension, compiled against the base's CUDA
# headers, has not been built (the stand-in lacks them; docs/LOG.md).
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
# torch first: Transformer Engine's extension (33 C++/CUDA files, no prebuilt wheel for this torch) is
# built against the torch already installed; ninja compiles them in parallel (without it: one at a
# time), numpy quiets torch's extension builder. MAX_JOBS bounds ninja's parallel compiles and
# NVTE_BUILD_THREADS_PER_JOB nvcc's threads in each (unbounded, an ordinary builder runs out of memory:
# raise them on a large one, `--build-arg MAX_JOBS=16`). CUDNN_PATH points the build at the cuDNN that
# torch's wheels installed in the venv, so TE links and loads the same one torch does, not the base's.
ARG MAX_JOBS=4
ARG NVTE_BUILD_THREADS_PER_JOB=1
RUN pip install torch==2.13.0 ninja numpy \
    && CUDNN_PATH="$(python -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])')" \
       MAX_JOBS=${MAX_JOBS} NVTE_BUILD_THREADS_PER_JOB=${NVTE_BUILD_THREADS_PER_JOB} \
       pip install --no-build-isolation "transformer-engine[pytorch]==2.20.2"
# the extension itself must load (importing transformer_engine alone succeeds with a broken one); a
# build has no GPU driver, so libcuda.so.1 comes from the toolkit's stub for this check only
RUN mkdir -p /tmp/cuda-stub && ln -sf /usr/local/cuda/lib64/stubs/libcuda.so /tmp/cuda-stub/libcuda.so.1 \
    && LD_LIBRARY_PATH=/tmp/cuda-stub python -c "import transformer_engine_torch, transformer_engine.pytorch" \
    && rm -rf /tmp/cuda-stub
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
