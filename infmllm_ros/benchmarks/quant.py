"""Quant suite: what each quantization mode costs and saves on the same model, streams and questions."""

from __future__ import annotations

import statistics

import torch
from tqdm import tqdm

from infmllm_ros.engine.loading import ModelLoadError
from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.evaluation import EvalResult, evaluate_episode

from .measure import decode_ms_per_token
from .scale import stream_frames

MODES = ("none", "cpu-int8", "nf4", "int8")


def stored_tensors(value) -> list[torch.Tensor]:
    """The tensors of one state_dict entry: packed quantized weights are a tuple (weight, bias)."""
    return [t for t in (value if isinstance(value, (tuple, list)) else (value,)) if isinstance(t, torch.Tensor)]


def tensor_bytes(value) -> int:
    """Bytes of one state_dict entry (packed int8 and 4-bit weights at their real size)."""
    return sum(t.numel() * t.element_size() for t in stored_tensors(value))


def model_megabytes(model: torch.nn.Module) -> float:
    """Bytes of every stored tensor, each once (a tied output head is the embedding table, listed
    twice by state_dict)."""
    unique = {}
    for value in model.state_dict().values():
        for tensor in stored_tensors(value):
            unique[(tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))] = tensor
    return sum(map(tensor_bytes, unique.values())) / 2**20


def run_quant(model_path, episodes: int, duration_s: float, frames: int = 64, modes=MODES):
    rows = []
    pool = stream_frames(frames)
    for mode in tqdm(modes, desc="quant modes", unit="mode"):
        try:
            session = StreamingSession(SessionConfig(model_path=model_path, quantization=mode, cache_policy="infmllm",
                                                     recall_store_mb=0.0))   # the policy's figures alone
        except ModelLoadError as error:
            rows.append({"mode": mode, "error": str(error)})
            continue
        ingest = []
        for index, frame in enumerate(pool):
            ingest.append(session.add_frame(frame, stamp=float(index)).seconds)
        decode = decode_ms_per_token(session)
        result = EvalResult()
        for seed in range(1, episodes + 1):
            evaluate_episode(session, seed, duration_s, result)
        accuracy = result.accuracy()
        rows.append({"mode": mode, "model_mb": model_megabytes(session.model),
                     "ingest_ms": 1000 * statistics.median(ingest), "decode_ms": decode,
                     **{f"acc_{family}": 100 * value for family, value in accuracy.items()}})
    return rows
