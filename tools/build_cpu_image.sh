#!/usr/bin/env bash
# Build the CPU image (docker/cpu.Dockerfile) for real on a machine without a Docker engine, then run
# its default job (CMD `train tiny`) and the test suite inside it.
#
# How: buildah and podman, which need no daemon: buildah builds with `--isolation chroot` (no nested
# container runtime), podman runs the result with runc (crun 1.8 rejects a hybrid cgroup v1/v2 host) and
# with explicit ulimits (podman lowers its own RLIMIT_NPROC to 32768 and asks for 1048576 open files;
# a root without CAP_SYS_RESOURCE cannot raise either back, so the runtime's setrlimit fails), and
# with a /dev/shm of SHM_SIZE (default 4g): a container's default is 64 MB, and vLLM's engine asks for
# 160 MiB there (tests/rollout/test_vllm_engine.py fails without it). Not --ipc host: the project's
# shm sender sweeps dead runs' buffers in /dev/shm, and other runs on the host keep theirs there.
# The base: where no container registry is reachable, python:3.11-slim-bookworm cannot be pulled, so
# a stand-in is made from Debian's own packages with debootstrap (bookworm minbase: Python 3.11 with
# its headers, venv, pip, CA certificates), with a venv at /opt/venv first on PATH, as `pip`/`python`
# are in the slim image (Debian's own pip refuses system installs, PEP 668). The headers: the slim
# image has them, and torch's inductor, which vLLM's CPU backend runs, compiles against Python.h.
# Everywhere else the Dockerfile's default base stays what it is; this script only passes
# --build-arg BASE_IMAGE.
# torch: a CPU build of torch 2.13.0 (`torch==2.13.0+cpu`) where this machine's pip can fetch one
# (or TORCH_WHEEL names one): it is bind-mounted into the build's RUN steps with a pip.conf that lists
# it (find-links) and the Dockerfile's `pip install torch==2.13.0` takes it (2.13.0+cpu satisfies
# ==2.13.0 and sorts above it); of the mount only its empty mount point stays in the image. Else
# TORCH_INDEX, if set, goes to the Dockerfile's own build argument; else pip's default index gives
# the CUDA build (several GB).
# A CA bundle (HOST_CA, else PIP_CERT, else SSL_CERT_FILE), where set, goes to pip in the same
# pip.conf: for a TLS-intercepting egress proxy. The build context is a clone of the committed HEAD.
#
#   bash tools/build_cpu_image.sh                     # all of it (as root; apt-get installs the tools)
#   SKIP_TESTS=1 bash tools/build_cpu_image.sh        # build and the default job only
#   SKIP_JOB=1 SKIP_TESTS=1 NO_CACHE=1 bash tools/build_cpu_image.sh   # a clean build only
#
# Environment: WORK (scratch, default /tmp/pcm-image), BASE (base image tag), IMAGE (image tag), SHM_SIZE,
# REBUILD_BASE=1 (debootstrap again), NO_CACHE=1 (no layer cache), PYTEST_ARGS (default "-q -x"),
# NICE (default "nice -n 10": the build, the job and the tests yield to other work on the machine).
# STORAGE_DRIVER=vfs (read by podman and buildah themselves) where the overlay driver does not work.
# A rebuild leaves the previous image untagged (about 5 GB): `podman image prune` removes it.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/pcm-image}
BASE=${BASE:-localhost/pcm-bookworm-py311}
IMAGE=${IMAGE:-localhost/pc-megatron:cpu}
PYTEST_ARGS=${PYTEST_ARGS:--q -x}
read -r -a NICE <<< "${NICE:-nice -n 10}"
mkdir -p "$WORK"
say() { printf '\n== %s\n' "$*"; }

# 1. the tools ---------------------------------------------------------------------------------------
need=()
for tool in podman:podman buildah:buildah debootstrap:debootstrap runc:runc; do
    command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" uidmap slirp4netns fuse-overlayfs
fi
# ulimits the runtime can set: at most this shell's hard limits, nproc at most podman's own 32768
lim() { local v; v=$(ulimit -H "$1"); [ "$v" = unlimited ] && v=$2; [ "$v" -gt "$2" ] && v=$2; echo "$v"; }
nofile=$(lim -n 1048576)
nproc=$(lim -u 32768)
RUN=(podman --runtime runc run --rm --network host --shm-size "${SHM_SIZE:-4g}"
     --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

# 2. the base image -----------------------------------------------------------------------------------
if [ "${REBUILD_BASE:-0}" = 1 ] || ! podman image exists "$BASE"; then
    say "debootstrap bookworm -> $BASE"
    rootfs=$WORK/rootfs
    rm -rf "$rootfs"
    # no mirror argument: debootstrap's default Debian mirror
    "${NICE[@]}" debootstrap --variant=minbase \
        --include=python3,python3-dev,python3-venv,python3-pip,ca-certificates \
        bookworm "$rootfs" > "$WORK/debootstrap.log"
    chroot "$rootfs" python3 -m venv /opt/venv
    chroot "$rootfs" apt-get clean
    rm -rf "$rootfs"/var/lib/apt/lists/*
    tar --numeric-owner -C "$rootfs" -c . | podman import \
        --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$BASE"
    rm -rf "$rootfs"
else
    say "base $BASE exists (REBUILD_BASE=1 to make it again)"
fi
"${RUN[@]}" "$BASE" sh -c 'python --version && pip --version'

# 3. the build ----------------------------------------------------------------------------------------
ctx=$WORK/ctx
rm -rf "$ctx"
git clone -q "$REPO" "$ctx"
say "building $IMAGE from $(git -C "$ctx" log -1 --format='%h %s' | cut -c1-90)"
pipdir=$WORK/pip          # mounted at /etc/xdg/pip in the build's RUN steps (pip's global config)
rm -rf "$pipdir" && mkdir -p "$pipdir"
build_args=(--build-arg "BASE_IMAGE=$BASE")
conf=()
if [ -n "${TORCH_WHEEL:-}" ]; then
    cp "$TORCH_WHEEL" "$pipdir/"
elif ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 -d "$pipdir" 'torch==2.13.0+cpu' 2>/dev/null; then
    rm -f "$pipdir"/*.whl
fi
if ls "$pipdir"/torch-*.whl >/dev/null 2>&1; then
    echo "torch: $(basename "$pipdir"/torch-*.whl) (mounted)"
    conf+=("find-links = /etc/xdg/pip")
elif [ -n "${TORCH_INDEX:-}" ]; then
    echo "torch: from TORCH_INDEX"
    build_args+=(--build-arg "TORCH_INDEX=$TORCH_INDEX")
else
    echo "torch: no CPU wheel and no TORCH_INDEX: pip's default index (the CUDA build)" >&2
fi
ca=${HOST_CA:-${PIP_CERT:-${SSL_CERT_FILE:-}}}
if [ -n "$ca" ] && [ -f "$ca" ]; then
    cp "$ca" "$pipdir/ca.crt"
    conf+=("cert = /etc/xdg/pip/ca.crt")
    echo "pip CA bundle: $ca"
fi
mounts=()
if [ ${#conf[@]} -gt 0 ]; then
    printf '[global]\n' > "$pipdir/pip.conf"
    printf '%s\n' "${conf[@]}" >> "$pipdir/pip.conf"
    mounts=(-v "$pipdir:/etc/xdg/pip:ro")
fi
cache=(--layers)
[ "${NO_CACHE:-0}" = 1 ] && cache=(--layers --no-cache)
start=$(date +%s)
(cd "$ctx" && "${NICE[@]}" buildah bud --isolation chroot --network host "${cache[@]}" "${build_args[@]}" \
    "${mounts[@]}" -f docker/cpu.Dockerfile -t "$IMAGE" .) 2>&1 | tee "$WORK/build.log"
build_s=$(( $(date +%s) - start ))
size=$(podman images --format '{{.Size}}' "$IMAGE" | head -1)
bytes=$(podman image inspect --format '{{.Size}}' "$IMAGE")
grep '^image ok' "$WORK/build.log" || true
say "build: ${build_s} s wall; $IMAGE: $size ($bytes bytes)"

# 4. the default job and the tests --------------------------------------------------------------------
if [ "${SKIP_JOB:-0}" != 1 ]; then
    say "default job: ${RUN[*]} $IMAGE"
    start=$(date +%s)
    "${NICE[@]}" "${RUN[@]}" "$IMAGE" > "$WORK/job.log" 2>&1 || { tail -40 "$WORK/job.log"; exit 1; }
    job_s=$(( $(date +%s) - start ))
    # the summary table: from its first rule line to the end of the output
    sed -n '/^-\{20,\}$/,$p' "$WORK/job.log"
    echo "job: ${job_s} s wall"
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    say "tests: ${RUN[*]} --entrypoint pytest $IMAGE $PYTEST_ARGS"
    start=$(date +%s)
    rc=0
    # shellcheck disable=SC2086  # PYTEST_ARGS: words
    "${NICE[@]}" "${RUN[@]}" --entrypoint pytest "$IMAGE" $PYTEST_ARGS > "$WORK/tests.log" 2>&1 || rc=$?
    tests_s=$(( $(date +%s) - start ))
    tail -25 "$WORK/tests.log"
    echo "tests: exit $rc, ${tests_s} s wall (log: $WORK/tests.log)"
fi
say "summary: build ${build_s} s, image $size${job_s:+, job ${job_s} s}${tests_s:+, tests ${tests_s} s (exit $rc)}"
