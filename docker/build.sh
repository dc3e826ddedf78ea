#!/usr/bin/env bash
# Build the pc-megatron images with the base images pinned in constraints.txt.
#
#   docker/build.sh gpu|cpu [TAG] [-- extra docker build args]
#   docker/build.sh cpu pc-megatron:cpu -- --build-arg TORCH_INDEX=<index of torch's CPU wheels>
#
# Tag default: pc-megatron:<kind>-<package version>. Needs a Docker engine (none runs on the
# machines this project is developed on; these scripts have not been run there).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: docker/build.sh gpu|cpu [TAG] [-- docker build args]}
shift
case $kind in gpu|cpu) ;; *) echo "unknown image kind '$kind': gpu or cpu" >&2; exit 2 ;; esac
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
tag=pc-megatron:$kind-$version
if [ $# -gt 0 ] && [ "$1" != "--" ]; then tag=$1; shift; fi
[ "${1:-}" = "--" ] && shift
base=$(sed -n "s/^# image $kind-base \(.*\)$/\1/p" constraints.txt)
[ -n "$base" ] || { echo "constraints.txt has no '# image $kind-base' line" >&2; exit 2; }
docker build -f "docker/$kind.Dockerfile" --build-arg BASE_IMAGE="$base" -t "$tag" "$@" .
echo "built $tag from $base"
