"""Attention kernels for the engine, installed as `infmllm_ros.kernels`.

`attention_with_key_mass` is the one entry point: attention output plus the attention mass each
cached key received. The torch reference runs everywhere; the fused Triton kernel (CUDA) plugs in
behind the same function.
"""

from .reference import attention_with_key_mass_reference

attention_with_key_mass = attention_with_key_mass_reference

__all__ = ["attention_with_key_mass", "attention_with_key_mass_reference"]
