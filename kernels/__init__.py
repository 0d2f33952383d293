"""Attention kernels for the engine, installed as `infmllm_ros.kernels`.

`attention_with_key_mass` is the one entry point: attention output plus the attention mass each
cached key received. The torch reference runs everywhere; the fused Triton kernel runs on CUDA
behind the same function (see dispatch.py for the switch).
"""

from .dispatch import active_kernel, attention_with_key_mass, use_kernel
from .reference import attention_with_key_mass_reference

__all__ = ["attention_with_key_mass", "attention_with_key_mass_reference", "active_kernel", "use_kernel"]
