"""``ray.*``: where a ``runtime=ray`` run's actors go (the cluster and its placement: ``ray_cluster.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pc_megatron.errors import ConfigError, check_choices


@dataclass
class RayConfig:
    """Ray placement (runtime=ray)."""

    address: str = ""
    """'' = start a Ray instance for this run (one machine); 'auto' or HOST:PORT = join the
    cluster started with `ray start --head` / `ray start --address=...`."""
    placement: Literal["colocated", "split"] = "colocated"
    """'colocated': learner rank i and engine replica i share bundle i (fractional GPU);
    'split': engines get bundles (GPUs) of their own."""
    bundles_per_node: int = 0
    """Bundles per placement group (one group per node); 0 = the node's GPU count on GPU
    clusters, all bundles in one group on CPU-only ones."""
    cpus_per_bundle: float = 1.0
    """CPUs in each bundle."""
    num_cpus: int = 0
    """A Ray instance started for this run: CPUs it may schedule (0 = enough for the bundles)."""
    object_store_mb: int = 1024
    """A Ray instance started for this run: object-store size (it falls back to /tmp when
    /dev/shm is small)."""
    temp_dir: str = ""
    """Ray's session and log folder; '' = <run dir>/ray (or a short link to it: Ray's socket
    paths must stay under 107 characters)."""
    call_timeout_s: float = 3600.0
    """Deadline of one learner call (a step's log-probs or update, a checkpoint)."""
    connect_timeout_s: float = 60.0
    """Joining a cluster (ray.address): the head must answer within this many seconds."""

    def validate(self) -> None:
        check_choices(self, "ray")
        if self.bundles_per_node < 0 or self.cpus_per_bundle <= 0 or self.call_timeout_s <= 0:
            raise ConfigError("ray.bundles_per_node must be >= 0, ray.cpus_per_bundle and ray.call_timeout_s > 0")
        if self.connect_timeout_s <= 0:
            raise ConfigError("ray.connect_timeout_s must be > 0")
