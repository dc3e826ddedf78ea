"""Version-checked shims for Megatron-Core 0.16: on a CPU torch build over gloo (``megatron_cpu``),
and for its distributed optimizer on torch's Adam, on any device (``torch_adam``)."""
