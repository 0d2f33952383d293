"""Attention kernels for the engine, installed as `infmllm_ros.kernels`.

The fused Triton kernel and its torch reference live here; the engine calls them through
one dispatch function and never imports Triton itself.
"""
