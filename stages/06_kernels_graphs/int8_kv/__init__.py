"""An int8 KV cache on the Triton backend: the lesson's attention kernels already read int8 codes
with their scales (`QUANTIZED`); this room brings the KV write that quantizes (kv_write.py)."""


def register() -> None:
    """Plug the room into the lesson: the lesson's kernel set takes int8 pools, written here."""
    import torch

    from ..triton_backend import register_stored_kv_write
    from .kv_write import write_int8_kv

    register_stored_kv_write(torch.int8, write_int8_kv)
