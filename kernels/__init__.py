"""Fused kernels. One op per subpackage, each with a plain-PyTorch reference (CPU fallback and
test oracle). Nothing here imports ``pc_megatron``."""
