"""How the server sets itself up on a device: which device and dtype, which of stage 06's kernels
(kernel_defaults.py), and how many KV blocks the memory holds (kv_pool.py)."""
