#!/usr/bin/env bash
# A multi-node run from the GPU image, without SLURM: one container per node, host networking
# (Ray and NCCL talk between nodes directly), all GPUs, the host's shared memory, and one shared
# folder at the same path on every node for models, data and run directories.
#
#   on the head:        docker/multinode.sh head IMAGE SHARED_DIR
#   on every other:     docker/multinode.sh worker IMAGE SHARED_DIR HEAD_IP
#   then, on the head:  docker/multinode.sh train IMAGE SHARED_DIR RECIPE [key=value ...]
#
# e.g. docker/multinode.sh train pc-megatron:gpu-0.1.0 /shared configs/deepmath-1.5b.yaml
# The train step runs the driver in a container of its own on the head (no GPU of its own:
# Ray places the learner ranks and engine replicas on the nodes' GPUs). Not run here (no Docker
# engine and no cluster on the development machines); docs/CLUSTER.md has the same launch by hand.
#
# The cluster admits only holders of one token (Ray's token authentication): make one per job and
# export it on every node before each call, e.g. RAY_AUTH_TOKEN=$(openssl rand -hex 32) once, copied
# to the other nodes by your own means. It reaches the containers by name (-e RAY_AUTH_TOKEN), never
# on a command line.
set -euo pipefail
role=${1:?usage: docker/multinode.sh head|worker|train IMAGE SHARED_DIR [HEAD_IP | RECIPE ...]}
image=${2:?image tag, e.g. pc-megatron:gpu-0.1.0}
shared=${3:?a folder every node mounts at the same path}
shift 3
PORT=${PCM_RAY_PORT:-6379}
: "${RAY_AUTH_TOKEN:?export RAY_AUTH_TOKEN, the same on every node: e.g. RAY_AUTH_TOKEN=\$(openssl rand -hex 32)}"
export RAY_AUTH_TOKEN
run=(docker run --rm --network host --ipc host --shm-size 64g --ulimit memlock=-1
     -e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN -v "$shared:$shared" -w "$shared" --entrypoint "")
# the interface NCCL and Gloo use between nodes, where the host has several
[ -n "${NCCL_SOCKET_IFNAME:-}" ] && run+=(-e NCCL_SOCKET_IFNAME -e GLOO_SOCKET_IFNAME="$NCCL_SOCKET_IFNAME")
# Ray's folders inside a 0700 folder of this container's own (Ray opens its session folder to all)
private_ray='d=$(mktemp -d /tmp/pcm-ray-XXXXXX) && exec ray start --temp-dir="$d/r"'
case $role in
    head)
        exec "${run[@]}" --gpus all --name pcm-ray-head "$image" \
            bash -c "$private_ray --head --port=$PORT --num-gpus=\$(nvidia-smi -L | wc -l) --block" ;;
    worker)
        head_ip=${1:?the IP address of the head node}
        exec "${run[@]}" --gpus all --name pcm-ray-worker "$image" \
            bash -c "$private_ray --address=$head_ip:$PORT --num-gpus=\$(nvidia-smi -L | wc -l) --block" ;;
    train)
        recipe=${1:?a recipe (configs/... or a YAML in SHARED_DIR)}
        shift
        exec "${run[@]}" --name pcm-driver "$image" \
            pc-megatron train "$recipe" "$@" runtime=ray ray.address="127.0.0.1:$PORT" out_dir="$shared/runs" ;;
    *) echo "unknown role '$role': head, worker or train" >&2; exit 2 ;;
esac
