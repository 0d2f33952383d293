"""`infmllm-train-tiny`: train the embedded model on synthetic camera streams (CPU, one session).

Stages: 0) the vision tower alone, directly supervised on frames (vision_pretraining.py); then the
tower is frozen and every frame's features are computed once (features.py), so 1) the language
model and projector train on windows of long streams without paying for vision again: short
windows first (seeing, what just left), then long and gapped ones (remembering minutes back), and
then a long phase of windows shaped like a 10-minute stream under a second learning-rate cycle,
and with `--rounds` the drill and fine-tune rounds the shipped weights came from (schedule.py), each
phase under its own cycle. Only answer tokens carry loss.

Runs safely in the background: rendered streams, the vision stage and a checkpoint (every
`--checkpoint-minutes`, on Ctrl-C and on SIGTERM) go to `--work-dir`; `--resume` picks up from
there. The model directory `--out` is written only at the end, atomically (a finished directory
is renamed into place), so an interrupted run never leaves a half-written shipped model.

Fixed seeds throughout. Training streams use seeds from TRAIN_SEED_BASE up, validation seeds
from 90,000; evaluation, benchmarks and the demo bag use seeds below 90,000, so what the model
is measured on was never trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlavaForConditionalGeneration

from infmllm_ros.models import embedded_model_path
from infmllm_ros.synthetic import FAMILIES, corpus_text
from infmllm_ros.synthetic.questions import FAMILY_OF_KIND

from .architecture import build_model, build_processor, save_model_dir, set_attention_factor, train_tokenizer
from .curve import plot_training_curve
from .data import FRAME_TOKENS, IGNORE, Window, build_sequence, sample_window
from .frame_targets import FIRST_TARGET_TOKEN, TARGETS_PER_FRAME
from .features import compute_features, language_model_loss
from .retrieval import best_head_mass, probing, retrieval_layers, use_probe_attention
from .schedule import Phase, learning_rate, phase_at, plan, total_steps
from .streams import RenderedStream, render_many_snapshots, render_streams
from .vision_pretraining import pretrain_vision_tower
from .widening import widen_into

TRAIN_SEED_BASE = 100_000
VISION_SEED_BASE = 110_000   # the vision stage's many short episodes
SHORT_TRAIN_SEED_BASE = 130_000   # short training episodes
VALIDATION_SEED_BASE = 90_000
SHORT_VALIDATION_SEED_BASE = 90_100
#: short validation episodes last as long as infmllm-eval's default ones
SHORT_VALIDATION_SECONDS = 64.0


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: save a checkpoint, then stop."""


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=embedded_model_path(), help="model directory to write at the end")
    parser.add_argument("--work-dir", type=Path, default=Path("build/train-tiny"),
                        help="rendered streams, vision stage and checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
    parser.add_argument("--redo-vision", action="store_true",
                        help="run stage 0 again on the frames already rendered in --work-dir")
    parser.add_argument("--streams", type=int, default=48, help="distinct training episodes to render")
    parser.add_argument("--stream-seconds", type=float, default=600.0, help="camera time per training episode")
    parser.add_argument("--short-streams", type=int, default=240,
                        help="short training episodes: an episode's seen-once objects come in its first "
                             "two minutes, so short episodes hold most of the long-range questions")
    parser.add_argument("--short-stream-seconds", type=float, default=90.0)
    parser.add_argument("--short-stream-share", type=float, default=0.5,
                        help="share of contiguous windows cut from the short episodes")
    parser.add_argument("--validation-streams", type=int, default=6)
    parser.add_argument("--validation-short-streams", type=int, default=20,
                        help="64 s validation episodes, as infmllm-eval streams them")
    parser.add_argument("--frame-target-weight", type=float, default=0.0,
                        help="weight of the dense per-frame targets (frame_targets.py); 0 = answers only")
    parser.add_argument("--side-questions", type=int, default=64,
                        help="side questions per training window (data.py), besides the stream's own; 0 = none")
    parser.add_argument("--balance-kinds", action="store_true",
                        help="pick memory side questions kind by kind in turn (data.kind_balanced_sample), so "
                             "the rarer colour-of-shape questions are asked as often as shape-of-colour ones")
    parser.add_argument("--side-kinds", default="",
                        help="comma-separated question kinds (e.g. colour_of_shape): every side question of "
                             "those kinds only, a drill for one skill (README, item 13 of the embedded model); "
                             "empty = all families by their shares")
    parser.add_argument("--vision-from", type=Path, default=None,
                        help="take the stage-0 vision tower from this model directory instead of training it")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="warm start: every weight (tower, projector, language model) from this model "
                             "directory of the same shape; implies --vision-from it (no stage 0)")
    parser.add_argument("--continue-vision", action="store_true",
                        help="with --init-from or --vision-from: run stage 0 again from that tower (new heads "
                             "fitted on it frozen first, then tower and heads for --vision-steps at --vision-lr) "
                             "instead of taking it as it is; the language model then reads the new tower")
    parser.add_argument("--attention-factor", type=float, default=1.3,
                        help="scale written into the saved model's RoPE (YaRN attention_factor at factor 1: "
                             "logits x factor^2) for streams longer than the training windows; training runs at 1")
    parser.add_argument("--rope-theta", type=float, default=10000.0,
                        help="RoPE base of the language model: a larger base leaves more slowly turning "
                             "dimensions to match content minutes apart (README, the embedded model)")
    parser.add_argument("--vision-episodes", type=int, default=3600,
                        help="short episodes for the vision stage, 8 frames each")
    parser.add_argument("--vision-steps", type=int, default=6000, help="stage 0: direct vision pretraining steps")
    parser.add_argument("--vision-lr", type=float, default=1e-3,
                        help="stage 0 peak learning rate (2e-3 left shape at 39 %% held out, 1e-3 learnt it)")
    parser.add_argument("--vision-width", type=int, default=128, help="CLIP tower hidden size")
    parser.add_argument("--vision-layers", type=int, default=6,
                        help="CLIP tower depth (6 layers learnt shape faster per step than 3: 55 vs 38 %% at 2,000)")
    parser.add_argument("--language-layers", type=int, default=6,
                        help="Llama depth (6 beat 4 on every family at the same wall time: README)")
    parser.add_argument("--language-heads", type=int, default=4,
                        help="attention heads per layer (64 wide each); with --init-from a narrower model "
                             "grows into the wider one, what it computes unchanged (widening.py)")
    parser.add_argument("--language-kv-heads", type=int, default=2, help="KV heads per layer (grouped-query)")
    parser.add_argument("--language-intermediate", type=int, default=512, help="Llama MLP width")
    parser.add_argument("--steps", type=int, default=5200, help="language-model steps (one window each)")
    parser.add_argument("--long-steps", type=int, default=1100,
                        help="then this many steps on windows shaped like a 10-minute stream (mostly scattered "
                             "ones, LONG_PHASE_MIX), under a second, lower learning-rate cycle; 0 = none")
    parser.add_argument("--long-lr", type=float, default=1.5e-4,
                        help="peak learning rate of the long phase and of each round's fine-tune")
    parser.add_argument("--rounds", type=int, default=0,
                        help="then this many rounds of a drill (--drill-*) and a long-stream fine-tune "
                             "(--round-steps, memory kinds in turn): the chain the shipped weights came from "
                             "(schedule.py, README item 15 of the embedded model); 0 = none")
    parser.add_argument("--drill-steps", type=int, default=1200, help="steps of each round's drill (short windows)")
    parser.add_argument("--drill-lr", type=float, default=5e-4, help="peak learning rate of each drill")
    parser.add_argument("--drill-kinds", default="colour_of_shape,colour_of_shape_earlier",
                        help="the side-question kinds each drill asks (comma-separated)")
    parser.add_argument("--drill-retrieval-weight", type=float, default=2.0,
                        help="retrieval-loss weight in the drills (the fine-tunes use --retrieval-weight)")
    parser.add_argument("--round-steps", type=int, default=1100, help="steps of each round's fine-tune")
    # One window per step is a batch of one: at 1.5e-3 (every earlier recipe) the language model
    # stayed near its priors for thousands of steps, even fed perfect symbolic frames; at 3e-4 the
    # same lookups formed within a few hundred steps (README, "The embedded model").
    parser.add_argument("--lr", type=float, default=3e-4, help="language-model peak learning rate")
    parser.add_argument("--short-share", type=float, default=0.3,
                        help="share of steps on short windows (8-32 frames) before long and gapped ones")
    parser.add_argument("--max-frames", type=int, default=64, help="longest contiguous training window")
    parser.add_argument("--gapped-share", type=float, default=0.35,
                        help="after the short windows, share of windows with a minutes-long position gap")
    parser.add_argument("--scattered-share", type=float, default=0.0,
                        help="after the short windows, share of scattered windows: runs around every seen-once "
                             "object askable at one time, among runs of the minutes between (data.py)")
    parser.add_argument("--scattered-frames", type=int, default=160, help="longest scattered window")
    parser.add_argument("--retrieval-weight", type=float, default=0.0,
                        help="weight of the retrieval loss (retrieval.py): attention at a memory answer on the "
                             "frames that show its object; 0 = answers only")
    parser.add_argument("--retrieval-evidence", choices=("frames", "objects"), default="frames",
                        help="where the retrieval loss points attention: the whole frames that show a memory "
                             "question's object, or only that object's patches in them, and for a current-scene "
                             "question its patches in the newest frame (evidence.py)")
    parser.add_argument("--validate-every", type=int, default=1000)
    parser.add_argument("--checkpoint-minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training")
    parser.add_argument("--render-workers", type=int, default=2, help="processes rendering episodes")
    args = parser.parse_args(argv)
    if args.init_from is not None:
        if args.vision_from is not None and args.vision_from.resolve() != args.init_from.resolve():
            parser.error("--init-from takes the tower from the same directory: leave --vision-from out")
        args.vision_from = args.init_from
    if args.continue_vision and args.vision_from is None:
        parser.error("--continue-vision continues a trained tower: give --init-from or --vision-from")
    if args.attention_factor <= 0:
        parser.error("--attention-factor must be positive")
    for flag in ("side_kinds", "drill_kinds"):
        kinds = frozenset(kind for kind in getattr(args, flag).split(",") if kind)
        if kinds - set(FAMILY_OF_KIND):
            parser.error(f"--{flag.replace('_', '-')}: unknown kind {sorted(kinds - set(FAMILY_OF_KIND))[0]!r} "
                         f"(known: {', '.join(sorted(FAMILY_OF_KIND))})")
        setattr(args, flag, kinds)
    if min(args.steps, args.long_steps, args.rounds, args.drill_steps, args.round_steps) < 0:
        parser.error("step and round counts cannot be negative")
    if not plan(args):
        parser.error("nothing to train: --steps, --long-steps and --rounds are all 0")
    return args


def check_writable(directory: Path) -> None:
    """Fail in the first second, not after two hours, if the model cannot be written."""
    parent = directory.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".write-test-"):
            pass
    except OSError as error:
        raise SystemExit(f"infmllm-train-tiny: cannot write the model to {directory}: {error.strerror or error}")


def write_model_atomically(model, processor, out: Path, record: dict) -> None:
    """Write into a sibling temporary directory, then swap it into place."""
    out = out.resolve()
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
    save_model_dir(model, processor, staging, record)
    plot_training_curve(record, staging / "training.png")
    old = out.parent / f".{out.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def save_atomically(obj, path: Path) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    torch.save(obj, partial)
    os.replace(partial, path)


class Streams:
    """The rendered training and validation streams with their frame features."""

    def __init__(self, saved: dict) -> None:
        self.train, self.validation = saved["train"], saved["validation"]
        self.short_train, self.short_validation = saved.get("short_train", []), saved.get("short_validation", [])


def prepare_streams(args, tokenizer, model, work_dir: Path):
    """Rendered streams with features, and the vision stage's accuracy (cached in work_dir)."""
    cached = work_dir / "streams.pt"
    tower_shape = {"width": args.vision_width, "layers": args.vision_layers,
                   "from": str(args.vision_from.resolve()) if args.vision_from else None,
                   # only when set: work dirs prepared before the option keep matching their cache
                   **({"continued": [args.vision_steps, args.vision_lr]} if args.continue_vision else {}),
                   "short": [args.short_streams, args.short_stream_seconds, args.validation_short_streams]}
    if cached.exists() and not args.redo_vision:
        saved = torch.load(cached, weights_only=False)
        if saved.get("tower_shape", {"width": 128, "layers": 3}) == tower_shape:
            model.model.vision_tower.load_state_dict(saved["vision_tower"])
            tqdm.write(f"loaded rendered streams and vision stage from {cached}")
            return Streams(saved), saved["vision_accuracy"], saved["seconds"]
        tqdm.write(f"{cached} holds other streams or another tower's features: preparing them again")
    started = time.perf_counter()
    rendered = work_dir / "rendered.pt"   # pixels too, so a new vision stage need not render again
    if rendered.exists():
        train, validation = torch.load(rendered, weights_only=False)
    else:
        train = render_streams([TRAIN_SEED_BASE + i for i in range(args.streams)], args.stream_seconds, tokenizer,
                               workers=args.render_workers)
        validation = render_streams([VALIDATION_SEED_BASE + i for i in range(args.validation_streams)],
                                    args.stream_seconds, tokenizer, workers=args.render_workers,
                                    desc="rendering validation streams")
        save_atomically((train, validation), rendered)
    short = _short_streams(args, tokenizer, work_dir)
    render_s = time.perf_counter() - started
    tower = model.model.vision_tower
    if args.vision_from and not args.continue_vision:
        vision_accuracy = _tower_from(args.vision_from, tower)
    else:
        inherited = _tower_from(args.vision_from, tower) if args.continue_vision else None
        snapshots = _vision_snapshots(args, tokenizer, work_dir)
        render_s = time.perf_counter() - started
        vision_accuracy = pretrain_vision_tower(
            tower, snapshots, validation, steps=args.vision_steps, lr=args.vision_lr, seed=args.seed,
            evaluate_every=args.validate_every,
            head_steps=min(CONTINUED_HEAD_STEPS, args.vision_steps) if inherited else 0)
        if inherited:
            vision_accuracy["continued_from"] = inherited
    tqdm.write("vision pretraining (held out): " + " ".join(f"{k} {v:.3f}" for k, v in vision_accuracy.items()
                                                            if isinstance(v, float)))
    for stream in tqdm(train + validation + short["short_train"] + short["short_validation"],
                       desc="frame features", unit="stream"):
        compute_features(model, stream)
    seconds = {"render": round(render_s, 1), "vision": round(time.perf_counter() - started - render_s, 1)}
    saved = {"train": train, "validation": validation, **short, "vision_accuracy": vision_accuracy,
             "vision_tower": tower.state_dict(), "tower_shape": tower_shape, "seconds": seconds}
    save_atomically(saved, cached)
    return Streams(saved), vision_accuracy, seconds


def _short_streams(args, tokenizer, work_dir: Path) -> dict:
    path = work_dir / "rendered_short.pt"
    key = [args.short_streams, args.short_stream_seconds, args.validation_short_streams]
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if saved["key"] == key:
            return {"short_train": saved["short_train"], "short_validation": saved["short_validation"]}
    short = {"short_train": render_streams([SHORT_TRAIN_SEED_BASE + i for i in range(args.short_streams)],
                                           args.short_stream_seconds, tokenizer, workers=args.render_workers,
                                           desc="rendering short streams") if args.short_streams else [],
             "short_validation": render_streams(
                 [SHORT_VALIDATION_SEED_BASE + i for i in range(args.validation_short_streams)],
                 SHORT_VALIDATION_SECONDS, tokenizer, workers=args.render_workers,
                 desc="rendering short validation streams") if args.validation_short_streams else []}
    save_atomically({"key": key, **short}, path)
    return short


def _vision_snapshots(args, tokenizer, work_dir: Path) -> list[RenderedStream]:
    snapshots_path = work_dir / "vision_frames.pt"
    snapshots = torch.load(snapshots_path, weights_only=False) if snapshots_path.exists() else []
    wanted = [VISION_SEED_BASE + i for i in range(args.vision_episodes)]
    have = {snapshot.seed for snapshot in snapshots}
    missing = [seed for seed in wanted if seed not in have]
    if missing:   # a larger --vision-episodes renders only the episodes not cached yet
        snapshots += render_many_snapshots(missing, 8, tokenizer, workers=args.render_workers)
        save_atomically(snapshots, snapshots_path)
    return [snapshot for snapshot in snapshots if snapshot.seed in set(wanted)]


def _take_from(directory: Path, what: str, load):
    """What `load` returns, given the trained model in `directory`; or one line saying why not."""
    try:
        return load(LlavaForConditionalGeneration.from_pretrained(directory))
    except (OSError, ValueError, RuntimeError) as error:
        raise SystemExit(f"infmllm-train-tiny: cannot take {what} from {directory}: {str(error).splitlines()[0]}")


def _warm_start(model, directory: Path, keep_tower: bool = False) -> list[str]:
    """Every weight from a trained model directory (same tokenizer; the same sizes, or a narrower
    language model grown into this one without changing what it computes: widening.py); returns the
    weights that grew. `keep_tower`: all but the vision tower, which stage 0 has just trained on (the
    frame features the language model will read come from it)."""
    tower = {k: v.clone() for k, v in model.model.vision_tower.state_dict().items()} if keep_tower else None
    grown = _take_from(directory, "every weight", lambda trained: widen_into(trained, model))
    if tower is not None:
        model.model.vision_tower.load_state_dict(tower)
    return grown


def _training_record(directory: Path) -> dict:
    """The training.json a model directory was written with; {} for one that has none (a real checkpoint)."""
    path = directory / "training.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _lineage(init_from: Path | None) -> list[str]:
    """The commands that made the weights a run starts from, oldest first: shipped weights are often
    a chain of runs (a drill, then a fine-tune, each --init-from the last), and a directory's own
    "command" names only the last link."""
    record = _training_record(init_from) if init_from else {}
    return record.get("lineage") or record.get("commands") or ([record["command"]] if "command" in record else [])


def _tower_from(directory: Path, tower) -> dict:
    """Load a trained model directory's vision tower into `tower`; its stage-0 record comes along."""
    _take_from(directory, "the vision tower",
               lambda trained: tower.load_state_dict(trained.model.vision_tower.state_dict()))
    record = _training_record(directory)
    earlier = record.get("vision_pretraining", {})
    return {**{k: v for k, v in earlier.items() if k != "history"}, "from": str(directory),
            "from_command": record.get("command")}


#: --continue-vision: steps fitting new heads on the inherited tower, frozen, before the tower trains
#: too, so the heads' first random gradients do not pull a trained tower off course (fewer if
#: --vision-steps is smaller)
CONTINUED_HEAD_STEPS = 1500

#: scattered validation windows per long validation stream: one gave 12 distant questions over six
#: streams, too few to read a curve from (README, item 5 of what moved ten-minute memory)
SCATTERED_VALIDATION_WINDOWS = 4


def validation_windows(streams: Streams) -> list[tuple[RenderedStream, Window]]:
    """Fixed windows: each short validation episode whole and the first 64 s of each long one (as
    infmllm-eval streams them), and one gapped and SCATTERED_VALIDATION_WINDOWS scattered windows
    per long stream reaching minutes back (the first of them the one earlier runs validated on)."""
    windows = [(stream, Window([(0, len(stream.frame_times))])) for stream in streams.short_validation]
    for stream in streams.validation:
        windows.append((stream, Window([(0, 64)])))
        gapped = sample_window(stream, random.Random(stream.seed), 64, gapped=True, offset_share=0.0)
        if len(gapped.segments) > 1:
            windows.append((stream, gapped))
        for draw in range(SCATTERED_VALIDATION_WINDOWS):
            rng = random.Random(stream.seed + 1_000_003 * draw)
            scattered = sample_window(stream, rng, 128, scattered=True, offset_share=0.0)
            if len(scattered.segments) > 1:
                windows.append((stream, scattered))
    return windows


def teacher_forced_accuracy(model, windows, tokenizer, object_evidence: bool = False) -> dict[str, float]:
    """Share of answers whose every token is the argmax, per question family; of the dense
    frame targets (frame_targets.py) that the argmax hits, scene lookups and what-left apart; and,
    per memory family, the attention mass on the evidence (retrieval.best_head_mass)."""
    right = {family: 0 for family in FAMILIES}
    masses: dict[str, list[float]] = {family: [] for family in FAMILIES}
    total = {family: 0 for family in FAMILIES}
    frame_right, frame_total = torch.zeros(TARGETS_PER_FRAME), torch.zeros(TARGETS_PER_FRAME)
    frame_id = tokenizer.convert_tokens_to_ids("<frame>")
    model.eval()
    with torch.inference_mode():
        for stream, window in windows:
            batch = build_sequence(stream, window, tokenizer, frame_targets=True, object_evidence=object_evidence)
            with probing(batch["retrieval_rows"], retrieval_layers(model)) as probe:
                all_logits = language_model_loss(model, batch, logits=True)[0]
            if batch["retrieval_rows"]:
                for family, mass in zip(batch["retrieval_families"], best_head_mass(probe, batch["retrieval_evidence"])):
                    masses[family].append(float(mass))
            targets = batch["frame_targets"][0]
            # each position's offset from its frame's first target token (questions sit between frames)
            positions = torch.arange(len(targets))
            frame_starts = torch.where(batch["input_ids"][0] == frame_id, positions, 0).cummax(0).values
            slot = (positions - frame_starts - FIRST_TARGET_TOKEN).clamp(0, FRAME_TOKENS - 1)
            held = targets != IGNORE
            hits = (all_logits.argmax(-1) == targets) & held
            frame_right += torch.bincount(slot[hits], minlength=FRAME_TOKENS)[:TARGETS_PER_FRAME].float()
            frame_total += torch.bincount(slot[held], minlength=FRAME_TOKENS)[:TARGETS_PER_FRAME].float()
            logits = all_logits[:-1]
            labels = batch["labels"][0, 1:]
            correct = (logits.argmax(-1) == labels).tolist()
            answers, current, previous = [], [], -2
            for position in (labels != IGNORE).nonzero().flatten().tolist():
                if current and position != previous + 1:
                    answers.append(current)
                    current = []
                current.append(position)
                previous = position
            if current:
                answers.append(current)
            for family, positions in zip(batch["families"], answers):
                total[family] += 1
                right[family] += int(all(correct[p] for p in positions))
    model.train()
    scene, left = slice(0, TARGETS_PER_FRAME - 2), slice(TARGETS_PER_FRAME - 2, TARGETS_PER_FRAME)
    return {**{family: right[family] / total[family] if total[family] else float("nan") for family in FAMILIES},
            "frame_scene": float(frame_right[scene].sum() / frame_total[scene].sum().clamp(min=1)),
            "frame_left": float(frame_right[left].sum() / frame_total[left].sum().clamp(min=1)),
            **{f"{family}_mass": sum(values) / len(values) for family, values in masses.items() if values}}


#: (gapped, scattered) shares of the long phase's windows, the rest contiguous: the mix of the
#: long-stream fine-tune that lifted distant 33 -> 44 % and long 50 -> 74-77 % on 600 s (README)
LONG_PHASE_MIX = (0.1, 0.6)


def next_window(args, phase: Phase, step: int, streams: Streams, rng: random.Random) -> tuple[RenderedStream, Window]:
    """The window optimizer step `step` of `phase` reads. First phase: short windows first, then
    gapped windows of the long streams (distant questions) and contiguous ones, from the short
    episodes or the long streams; long phases: mostly scattered windows (LONG_PHASE_MIX); drills:
    short windows only."""
    long_stream = streams.train[rng.randrange(len(streams.train))]
    short_only = phase.windows == "short" or (phase.windows == "first"
                                              and step - phase.start < args.short_share * phase.steps)
    if not short_only:
        gapped_share, scattered_share = (LONG_PHASE_MIX if phase.windows == "long"
                                         else (args.gapped_share, args.scattered_share))
        draw = rng.random()
        if draw < gapped_share:
            return long_stream, sample_window(long_stream, rng, rng.randint(40, 64), gapped=True)
        if draw < gapped_share + scattered_share:
            frames = rng.randint(min(args.max_frames, args.scattered_frames), args.scattered_frames)
            return long_stream, sample_window(long_stream, rng, frames, scattered=True)
    stream = long_stream
    if streams.short_train and rng.random() < args.short_stream_share:
        stream = streams.short_train[rng.randrange(len(streams.short_train))]
    if short_only:
        return stream, sample_window(stream, rng, rng.randint(8, 32), gapped=False)
    return stream, sample_window(stream, rng, rng.randint(16, args.max_frames), gapped=False)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_writable(args.out)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = train_tokenizer(corpus_text(range(200)))
    model = build_model(tokenizer, args.vision_width, args.vision_layers, args.language_layers,
                        args.rope_theta, args.language_heads, args.language_kv_heads,
                        args.language_intermediate).train()
    checkpoint_path = args.work_dir / "checkpoint.pt"
    if not args.resume and checkpoint_path.exists():
        raise SystemExit(f"infmllm-train-tiny: {checkpoint_path} exists: pass --resume to continue it, "
                         "or remove it to start over")
    try:
        streams, vision_accuracy, stage_seconds = prepare_streams(args, tokenizer, model, args.work_dir)
    except (KeyboardInterrupt, Interrupted):
        print("infmllm-train-tiny: interrupted before the language-model stage; rendered streams and the "
              "vision stage are redone on the next run", file=sys.stderr)
        return 130
    if args.init_from is not None and not (args.resume and checkpoint_path.exists()):
        grown = _warm_start(model, args.init_from, keep_tower=args.continue_vision)
        if grown:
            tqdm.write(f"widened {len(grown)} weights of {args.init_from} (new heads and MLP units start silent)")
    windows = validation_windows(streams)
    object_evidence = args.retrieval_evidence == "objects"
    use_probe_attention(model)
    model.model.vision_tower.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # base rate 1, so the scheduler's factor is the rate itself (learning_rate), phase by phase
    optimizer = torch.optim.AdamW(trainable, lr=1.0, weight_decay=0.01, betas=(0.9, 0.98))
    phases = plan(args)
    last_step = total_steps(phases)
    phase_ends = {phase.end for phase in phases}
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate(phases, step))
    sampler = random.Random(args.seed)
    state = {"step": 0, "history": [], "smoothed": None, "seconds": 0.0}
    if args.resume and checkpoint_path.exists():
        saved = torch.load(checkpoint_path, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        sampler.setstate(saved["sampler"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]
        tqdm.write(f"resumed from {checkpoint_path} at step {state['step']}")
    command = "infmllm-train-tiny " + " ".join(sys.argv[1:] if argv is None else argv)
    state.setdefault("commands", []).append(f"{command}  # from step {state['step']}")

    def checkpoint():
        state["seconds"] += time.perf_counter() - segment_start
        save_atomically({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "schedule": schedule.state_dict(), "sampler": sampler.getstate(),
                         "torch_rng": torch.get_rng_state(), "state": state}, checkpoint_path)
        return time.perf_counter()

    segment_start = last_save = time.perf_counter()
    progress = tqdm(range(state["step"], last_step), desc="training", unit="step", initial=state["step"],
                    total=last_step)
    try:
        for step in progress:
            phase = phase_at(phases, step)
            stream, window = next_window(args, phase, step, streams, sampler)
            batch = build_sequence(stream, window, tokenizer, frame_targets=args.frame_target_weight > 0,
                                   side_questions=args.side_questions, rng=sampler, balance_kinds=phase.balance_kinds,
                                   side_kinds=phase.side_kinds, object_evidence=object_evidence)
            if batch["families"] or batch["side_families"]:
                loss = language_model_loss(model, batch, frame_target_weight=args.frame_target_weight,
                                           retrieval_weight=phase.retrieval_weight)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                smoothed = state["smoothed"]
                state["smoothed"] = loss.item() if smoothed is None else 0.98 * smoothed + 0.02 * loss.item()
                progress.set_postfix(phase=phase.name, loss=f"{state['smoothed']:.3f}", frames=len(window.frames))
            schedule.step()
            state["step"] = step + 1
            if state["step"] % args.validate_every == 0 or state["step"] in phase_ends:
                accuracy = teacher_forced_accuracy(model, windows, tokenizer, object_evidence=object_evidence)
                state["history"].append({"step": state["step"], "loss": state["smoothed"],
                                         "lr": optimizer.param_groups[0]["lr"], **accuracy})
                tqdm.write(f"step {state['step']}: loss {state['smoothed']:.3f} "
                           + " ".join(f"{k} {v:.2f}" for k, v in accuracy.items()), file=sys.stdout)
            if time.perf_counter() - last_save > 60 * args.checkpoint_minutes:
                segment_start = last_save = checkpoint()
    except (KeyboardInterrupt, Interrupted) as why:
        progress.close()
        checkpoint()
        print(f"infmllm-train-tiny: interrupted ({why or 'Ctrl-C'}) at step {state['step']}; checkpoint saved in "
              f"{checkpoint_path}; run again with --resume to continue", file=sys.stderr)
        return 130
    segment_start = checkpoint()

    record = {"vision_pretraining": vision_accuracy, "stage_seconds": stage_seconds,
              "train_seconds": round(time.perf_counter() - started, 1),
              "language_model_seconds": round(state["seconds"], 1),
              "steps": args.steps, "long_steps": args.long_steps, "long_lr": args.long_lr,
              "rounds": args.rounds, "drill_steps": args.drill_steps, "drill_lr": args.drill_lr,
              "drill_kinds": sorted(args.drill_kinds), "drill_retrieval_weight": args.drill_retrieval_weight,
              "round_steps": args.round_steps,
              "phases": [{"name": phase.name, "start": phase.start, "steps": phase.steps, "lr": phase.lr}
                         for phase in phases],
              "streams": args.streams, "stream_seconds": args.stream_seconds,
              "short_streams": args.short_streams, "short_stream_seconds": args.short_stream_seconds,
              "frame_target_weight": args.frame_target_weight, "retrieval_weight": args.retrieval_weight,
              "retrieval_evidence": args.retrieval_evidence,
              "side_questions": args.side_questions, "balance_kinds": args.balance_kinds,
              "side_kinds": sorted(args.side_kinds),
              "language_layers": args.language_layers, "language_heads": args.language_heads,
              "language_kv_heads": args.language_kv_heads, "language_intermediate": args.language_intermediate,
              "init_from": str(args.init_from) if args.init_from else None,
              "attention_factor": args.attention_factor, "rope_theta": args.rope_theta,
              "lr": args.lr, "seed": args.seed, "train_seed_base": TRAIN_SEED_BASE,
              "short_train_seed_base": SHORT_TRAIN_SEED_BASE,
              "validation_seed_base": VALIDATION_SEED_BASE, "validation": state["history"],
              "command": command, "commands": state["commands"],
              "lineage": _lineage(args.init_from) + state["commands"]}
    set_attention_factor(model.config.text_config, args.attention_factor)
    model.set_attn_implementation({"text_config": "sdpa", "vision_config": "sdpa"})   # the probe is for training
    try:
        write_model_atomically(model.eval(), build_processor(tokenizer), args.out, record)
    except OSError as error:
        print(f"infmllm-train-tiny: could not write {args.out} ({error}); the trained weights are in "
              f"{checkpoint_path}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} after {record['train_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
