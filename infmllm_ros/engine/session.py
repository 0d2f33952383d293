"""A streaming conversation with an MLLM over a camera: frames in, answers out, bounded memory.

Frames and questions are appended to one KV cache as they arrive; answers are decoded greedily on
top of it and stay in it, so a later question sees earlier frames, questions and answers without
recomputing any history. The session drives every forward itself (no `generate()`), which is what
lets it evict between forwards and assign positions inside the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Generator, Iterator

import numpy as np
import torch
from PIL import Image

from .adapters import PromptFormat, positions_for
from .attention import SCORING_ATTENTION, collecting_attention_mass
from .cache import BoundedCache
from .loading import load_model_and_processor, resolve_model_path
from .policies import AttentionSaddles, CachePolicy, make_policy, policy_class, policy_settings
from .probe import QueryProbe
from .pruning import TemporalPruner, merged_embeddings
from .recall import RecallStore


AUTO = 0
PRUNE_UNITS = ("token", "frame")
#: AUTO sizes in frames of the model, never below the token counts the embedded model (17 tokens a
#: frame) was measured with: a Qwen2-VL frame of 640x480 is ~400 tokens, so fixed token defaults
#: would reject every frame of it (chunk) or keep two frames (budget)
AUTO_SIZES = {"cache_budget": (16, 1024), "recent_window": (4, 256), "eviction_chunk": (1, 64)}
#: the frame size (height, width) sizes are computed for: what most robot cameras publish
REFERENCE_FRAME = (480, 640)
#: recall_store_mb's default: recall on under a bounded policy (DEFAULT_RECALL_STORE_MB), off under
#: `full`, which evicts nothing; an explicit store under `full` is refused as meaningless. On by
#: default because on the embedded model it lifts answers about minutes-old objects by 7-10 points
#: at 5-10 % budgets for ~35 ms more to the first token (README, Results 1 and 2b); 64 MB holds ten
#: minutes of its frames at 1 frame/s
RECALL_AUTO = -1.0
DEFAULT_RECALL_STORE_MB = 64.0


@dataclass
class SessionConfig:
    """Every knob of a session; the node's parameters map one to one onto these names."""

    model_path: str | None = None      # None: the embedded tiny model
    device: str = "cpu"
    dtype: str = "float32"
    quantization: str = "auto"        # none | nf4 | int8 | cpu-int8 | auto (quantization.default_mode)
    cache_policy: str = "infmllm"
    # The three sizes are tokens; AUTO (0) sizes them from the model's tokens per frame (AUTO_SIZES)
    cache_budget: int = AUTO           # tokens per layer after an eviction
    recent_window: int = AUTO          # newest tokens always kept (infmllm, h2o)
    eviction_chunk: int = AUTO         # cache may exceed the budget by this much before evicting
    # the two below default to the policy's own defaults (one place: policies/infmllm.py)
    sink_tokens: int = AttentionSaddles.sink               # first tokens always kept (streaming, infmllm)
    attention_bias: float = AttentionSaddles.attention_bias  # infmllm: saddle evidence forgotten per eviction
    saddle_pool: int = AttentionSaddles.pool                 # infmllm: neighbouring keys in a saddle's local sum
    max_new_tokens: int = 16
    # Recall: evicted frames kept whole in host memory (MB; 0 = off; RECALL_AUTO: on unless `full`)
    # and put back, the `recall_frames` that best match a question, for that answer only
    recall_store_mb: float = RECALL_AUTO
    recall_frames: int = 4
    # Temporal pruning: a frame's visual tokens at least this cosine-similar to what their patch last
    # appended are left out (0 = off: every token appended)
    prune_similarity: float = 0.0
    prune_unit: str = "token"          # token: each patch on its own; frame: a frame whole, or not at all

    def __post_init__(self) -> None:
        if (self.recall_store_mb < 0 and self.recall_store_mb != RECALL_AUTO) or self.recall_frames < 0:
            raise ValueError(f"recall_store_mb must be >= 0 or {RECALL_AUTO:g} (auto), and recall_frames >= 0")
        if not 0.0 <= self.prune_similarity <= 1.0:
            raise ValueError(f"prune_similarity must be between 0 (off) and 1, got {self.prune_similarity}")
        if self.prune_unit not in PRUNE_UNITS:
            raise ValueError(f"prune_unit must be one of {', '.join(PRUNE_UNITS)}, got {self.prune_unit!r}")
        if self.recall_store_mb > 0 and self.cache_policy == "full":
            raise ValueError("recall brings back evicted frames, and the full cache evicts none: "
                             f"set recall_store_mb to 0 or {RECALL_AUTO:g} (auto), or choose a bounded cache_policy")

    @property
    def store_megabytes(self) -> float:
        """The recall store's size, RECALL_AUTO resolved: the default under a bounded policy, 0 under full."""
        if self.recall_store_mb == RECALL_AUTO:
            return 0.0 if self.cache_policy == "full" else DEFAULT_RECALL_STORE_MB
        return self.recall_store_mb

    @property
    def recall_on(self) -> bool:
        """Whether evicted frames are stored and recalled."""
        return self.store_megabytes > 0 and self.recall_frames > 0

    def sized(self, frame_tokens: int) -> "SessionConfig":
        """This config with AUTO sizes replaced by frame counts of the model, and the sizes checked
        against one frame: a cache that can never take a frame is a configuration error."""
        sizes = {name: getattr(self, name) or max(frames * frame_tokens, floor)
                 for name, (frames, floor) in AUTO_SIZES.items()}
        if self.cache_policy != "full" and sizes["eviction_chunk"] < frame_tokens:
            raise ValueError(f"one {REFERENCE_FRAME[1]}x{REFERENCE_FRAME[0]} frame is {frame_tokens} tokens of this "
                             f"model, more than eviction_chunk ({sizes['eviction_chunk']}): set eviction_chunk to at "
                             f"least {frame_tokens}, or to 0 to size the cache from the model")
        return replace(self, **sizes, recall_store_mb=self.store_megabytes)

    def make_policy(self) -> CachePolicy:
        """The policy these settings name, given those of the settings it has."""
        offered = dict(budget=self.cache_budget, chunk=self.eviction_chunk, recent=self.recent_window,
                       sink=self.sink_tokens, attention_bias=self.attention_bias, pool=self.saddle_pool)
        return make_policy(self.cache_policy, **policy_settings(self.cache_policy, offered))


@dataclass
class Answer:
    text: str
    tokens: int
    ttft_s: float
    total_s: float
    frames_seen: int
    newest_frame_stamp: float | None
    cache_tokens: int
    recalled_stamps: tuple = ()   # stamps of the stored frames put back for this answer (recall)


@dataclass
class StepTiming:
    """What one append cost, for stats and benchmarks."""

    tokens: int           # appended
    seconds: float
    evicted: bool = False
    pruned: int = 0       # tokens left out (temporal pruning): visual ones, or a whole frame's by frame


class StreamingSession:
    """One camera stream and its conversation. Not thread-safe: one thread should own it."""

    def __init__(self, config: SessionConfig | None = None, model=None, processor=None) -> None:
        config = config or SessionConfig()
        attention = SCORING_ATTENTION if policy_class(config.cache_policy).needs_attention_mass else "sdpa"
        model_dir = resolve_model_path(config.model_path)
        if model is None:
            model, processor = load_model_and_processor(model_dir, config.device, config.dtype, attention,
                                                        config.quantization)
        else:
            model.set_attn_implementation({"text_config": attention, "vision_config": "sdpa"})
        self.model, self.processor = model, processor
        self.device = next(model.parameters()).device
        self.family = model.config.model_type
        self.prompt = PromptFormat.for_model(model_dir, self.family)
        self.positions = positions_for(model)
        self.tokenizer = processor.tokenizer
        self.frame_tokens = self._tokens_per_frame()
        self.config = config.sized(self.frame_tokens)
        self.stop_ids = {self.tokenizer.eos_token_id} - {None}
        self.frames_seen = 0
        self.newest_frame_stamp: float | None = None
        self.last_answer: Answer | None = None
        self.probe = QueryProbe(model) if self.config.recall_on else None
        self.pruner = (TemporalPruner(self.config.prune_similarity, model.config.image_token_id,
                                      whole_frames=self.config.prune_unit == "frame")
                       if self.config.prune_similarity > 0 else None)
        self.reset()

    @property
    def policy(self) -> CachePolicy:
        """The cache's policy (the cache owns it: one place to change it)."""
        return self.cache.policy

    def reset(self) -> None:
        """Forget the stream: an empty cache, positions from zero."""
        text_model = self.model.get_decoder()
        recall = self.config.recall_on
        self.cache = BoundedCache(self.model.config.get_text_config().num_hidden_layers, self.config.make_policy(),
                                  text_model.rotary_emb.inv_freq.detach().clone(), self.positions,
                                  store=RecallStore(self.config.recall_store_mb) if recall else None,
                                  recall_allowance=self.config.recall_frames * self.frame_tokens if recall else 0)
        self.frames_seen = 0
        self.newest_frame_stamp = None
        self._evictions_seen_by_pruner = 0
        if self.pruner is not None:
            self.pruner.reset()

    def _tokens_per_frame(self) -> int:
        """Tokens one REFERENCE_FRAME camera frame takes in this model's prompt format."""
        blank = Image.new("RGB", REFERENCE_FRAME[::-1])
        return int(self._frame_inputs(blank)["input_ids"].shape[-1])

    def _frame_inputs(self, image: Image.Image) -> dict:
        """One camera frame in this model's prompt format, as its processor prepares it."""
        return self.processor(text=self.prompt.frame, images=[image], return_tensors="pt")

    # ---- appending -------------------------------------------------------------------------

    def add_frame(self, rgb: np.ndarray, stamp: float | None = None) -> StepTiming:
        """Append one camera frame (H x W x 3 uint8 RGB)."""
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError("a frame must be an H x W x 3 uint8 RGB array")
        start = time.perf_counter()
        inputs = self._frame_inputs(Image.fromarray(rgb))
        count = inputs["input_ids"].shape[-1]
        if count > self.policy.chunk and self.policy.name != "full":
            raise ValueError(f"one frame is {count} tokens, more than the eviction chunk ({self.policy.chunk}); "
                             "raise eviction_chunk or lower the image resolution")
        keep = embeddings = None
        if self.pruner is not None:
            self._forget_evicted_patches()
            embeddings = merged_embeddings(self.model, {k: v.to(self.device) for k, v in inputs.items()})
            keep = self.pruner.select(inputs["input_ids"].to(self.device), embeddings)
            embeddings = embeddings[:, keep]
        first_token = self.cache.tokens_seen
        if keep is not None and not keep.any():   # the whole frame repeats what was appended
            self.cache.skip(inputs)
            evicted = False
        else:
            evicted = self._forward(inputs, frame_stamp=stamp, frame=True, keep=keep, embeddings=embeddings)[1]
        if self.pruner is not None:
            self.pruner.commit(first_token)
        if self.device.type == "cuda":   # the frame's time is its kernels' time, not their queueing
            torch.cuda.synchronize(self.device)
        self.frames_seen += 1
        self.newest_frame_stamp = stamp
        appended = count if keep is None else int(keep.sum())
        return StepTiming(tokens=appended, seconds=time.perf_counter() - start, evicted=evicted,
                          pruned=count - appended)

    def skip_frame(self, rgb: np.ndarray) -> None:
        """Advance positions past one frame without appending it: what comes next sits where it
        would had the frame been streamed (a diagnostic's stream with frames left out)."""
        self.cache.skip(self._frame_inputs(Image.fromarray(rgb)))

    def skip_text(self, text: str) -> None:
        """Advance positions past `text` without appending it (see skip_frame)."""
        self.cache.skip(self.tokenizer(text, add_special_tokens=False, return_tensors="pt"))

    def _forget_evicted_patches(self) -> None:
        """After evictions, the patches whose last appended token most layers and heads no longer hold
        are sent again: a still scene must not vanish from the cache because it stopped changing."""
        if self.pruner.appended_at is None or self.cache.evictions == self._evictions_seen_by_pruner:
            return
        self._evictions_seen_by_pruner = self.cache.evictions
        tokens = self.pruner.appended_at.cpu()
        order = tokens.argsort()   # distinct stream indices: one-token spans, ascending
        share = torch.empty(len(tokens))
        share[order] = self.cache.cached_share(tokens[order], tokens[order] + 1)
        self.pruner.forget(share < 0.5)

    def add_text(self, text: str) -> torch.Tensor:
        """Append text (in pieces of at most one chunk); returns the logits after its last token."""
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if ids.shape[-1] == 0:
            raise ValueError("empty text")
        logits = None
        for piece in ids.split(self.policy.chunk, dim=-1):
            logits, _ = self._forward({"input_ids": piece})
        return logits

    def feed_token(self, token_id: int) -> torch.Tensor:
        """Append one token, as a decoding step does; returns the next-token logits."""
        return self._forward({"input_ids": torch.tensor([[token_id]])})[0]

    def score_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Append token ids (1-D, at most one chunk) and return the logits after each of them (n, vocab).

        What perplexity over an unbounded text stream needs: row i predicts the token after ids[i],
        computed against the bounded cache exactly as a streaming answer would be.
        """
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError("score_tokens takes a non-empty 1-D tensor of token ids")
        return self._forward({"input_ids": ids[None]}, every_position=True)[0]

    def _forward(self, inputs: dict, every_position: bool = False, frame: bool = False,
                 frame_stamp: float | None = None, score_keys: bool = True, keep: torch.Tensor | None = None,
                 embeddings: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """One forward through the bounded cache. `score_keys` False: the keys' attention mass is not
        counted (a probe forward whose tokens are forgotten afterwards). `keep`/`embeddings`: a pruned
        frame, the tokens of `inputs` to append and their input embeddings (already merged)."""
        position_ids, evicted = self.cache.admit(inputs, frame=frame, stamp=frame_stamp, keep=keep)
        if embeddings is not None:
            model_inputs = {"inputs_embeds": embeddings}
        else:
            model_inputs = {k: v.to(self.device) for k, v in inputs.items() if k != "attention_mask"}
        with torch.inference_mode(), collecting_attention_mass(self.cache if score_keys else None):
            output = self.model(**model_inputs, position_ids=position_ids.to(self.device), cache=self.cache,
                                use_cache=True, logits_to_keep=0 if every_position else 1)
        return (output.logits[0] if every_position else output.logits[0, -1]), evicted

    # ---- asking ----------------------------------------------------------------------------

    def stream(self, question: str, max_new_tokens: int | None = None) -> Generator[str, None, Answer]:
        """Yield the answer's text piece by piece; the generator's return value is the Answer.

        Every generated token, the stop token included, is appended to the cache so the next
        round sees the whole exchange.
        """
        if not question or not question.strip():
            raise ValueError("empty question")
        limit = max_new_tokens or self.config.max_new_tokens
        started = time.perf_counter()
        try:
            recalled, logits = self._ask_with_recall(self.prompt.question.format(question=question.strip()), limit)
            text, generated, ttft = yield from self._decode(logits, limit, started)
        finally:
            self.cache.release_recalled()
        answer = Answer(text=text.strip(), tokens=len(generated), ttft_s=ttft or 0.0,
                        total_s=time.perf_counter() - started, frames_seen=self.frames_seen,
                        newest_frame_stamp=self.newest_frame_stamp, cache_tokens=self.cache.length,
                        recalled_stamps=recalled)
        self.last_answer = answer
        return answer

    def _ask_with_recall(self, question: str, limit: int) -> tuple[tuple, torch.Tensor]:
        """Append the question, first putting back the stored frames that best match it (when recall
        is on and something is stored): (stamps of the frames recalled, logits after the question).

        The question is fed once with its keys unscored to read its queries, forgotten, and fed
        again after the chosen frames are in. Room for the answer is made first (as much as one
        chunk allows), so the recalled frames normally stay for all of it; an eviction the answer
        still needs takes them out first."""
        store = self.cache.store
        if store is None or not len(store) or self.config.recall_frames == 0:
            return (), self.add_text(question)
        ids = self.tokenizer(question, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if ids.shape[-1] > self.policy.chunk:
            return (), self.add_text(question)
        self.cache.make_room(min(ids.shape[-1] + limit, self.policy.chunk))
        with self.probe.attached():
            self._forward({"input_ids": ids}, score_keys=False)
        self.cache.forget_newest(ids.shape[-1])
        # a frame the policy still mostly keeps would only come back twice
        mostly_cached = self.cache.cached_share(*store.spans()) > 0.5
        frames = store.best(self.probe.grouped(), self.config.recall_frames, skip=mostly_cached)
        self.cache.recall(frames)
        return tuple(frame.stamp for frame in frames), self._forward({"input_ids": ids})[0]

    def _decode(self, logits: torch.Tensor, limit: int, started: float) -> Generator[str, None, tuple]:
        """Greedy decoding on top of the cache; yields visible text pieces, returns (text, ids, ttft)."""
        generated: list[int] = []
        decoded, text, ttft = "", "", None
        prefix = read = 0   # incremental decoding: only the tokens since the last emitted piece are decoded
        for _ in range(limit):
            token = int(torch.argmax(logits))
            ttft = ttft if ttft is not None else time.perf_counter() - started
            generated.append(token)
            logits = self.feed_token(token)
            if token in self.stop_ids:
                break
            before = self.tokenizer.decode(generated[prefix:read], skip_special_tokens=True)
            after = self.tokenizer.decode(generated[prefix:], skip_special_tokens=True)
            if len(after) > len(before) and not after.endswith("\ufffd"):   # not mid-way through a character
                decoded += after[len(before):]
                prefix, read = read, len(generated)
            stop_at = min((decoded.find(s) for s in self.prompt.stop if s in decoded), default=-1)
            visible = decoded if stop_at < 0 else decoded[:stop_at]
            if len(visible) > len(text):
                yield visible[len(text):]
                text = visible
            if stop_at >= 0:
                break
        return text, generated, ttft

    def ask(self, question: str, max_new_tokens: int | None = None) -> Answer:
        """Answer a question about everything streamed so far."""
        pieces = self.stream(question, max_new_tokens)
        while True:
            try:
                next(pieces)
            except StopIteration as done:
                return done.value

    def tokens(self, question: str, max_new_tokens: int | None = None) -> Iterator[str]:
        """Just the text pieces of an answer (the Answer lands in `last_answer`)."""
        yield from self.stream(question, max_new_tokens)

    @property
    def cache_tokens(self) -> int:
        return self.cache.length

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes()
