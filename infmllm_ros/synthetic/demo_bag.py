"""Write the demo rosbag2 (MCAP): a synthetic camera stream plus timed questions.

The bag is what a robot would record: JPEG CompressedImage frames on the camera topic
and std_msgs/String queries on the query topic, so the node can be demonstrated with
``ros2 bag play`` and no camera. ``questions.json`` beside the data holds the answers for
scoring; ``params.json`` records what made the bag, so a rerun with the same arguments is
a no-op (the bag is a pure function of them) and a rerun with other ones asks for --force.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from tqdm import tqdm

from .questions import Question, generate_questions
from .world import generate_episode

IMAGE_TOPIC = "/camera/image_raw/compressed"
QUERY_TOPIC = "/infmllm/query"
IMAGE_TYPE = "sensor_msgs/msg/CompressedImage"
STRING_TYPE = "std_msgs/msg/String"
FRAME_ID = "camera"
JPEG_QUALITY = 80
# A fixed wall-clock origin (2025-01-01T00:00:00Z) instead of "now": the same arguments
# must give the same bytes, and stamps that look like real ones keep ROS tools happy.
START_NS = 1_735_689_600 * 10**9
FORMAT_VERSION = 1  # bump when the world, renderer or layout changes, to invalidate old bags
DEFAULT_OUT = "data/demo_bag"
DEFAULT_SEED = 7
DEFAULT_DURATION_S = 150.0
DEFAULT_RATE_HZ = 10.0
_TYPESTORE = get_typestore(Stores.ROS2_KILTED)  # the distro in requirements-ros.txt


def _stamp(t: float) -> int:
    """Bag time in ns for t seconds after the start."""
    return START_NS + round(t * 1e9)


def _image_message(rgb: np.ndarray, ns: int) -> bytes:
    types = _TYPESTORE.types
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)  # OpenCV encodes BGR; JPEG viewers then show RGB
    ok, jpeg = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    header = types["std_msgs/msg/Header"](
        stamp=types["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9), frame_id=FRAME_ID)
    msg = types[IMAGE_TYPE](header=header, format="jpeg", data=jpeg.reshape(-1))
    return bytes(_TYPESTORE.serialize_cdr(msg, IMAGE_TYPE))


def _query_message(qid: str, question: Question) -> bytes:
    data = json.dumps({"id": qid, "question": question.text})
    return bytes(_TYPESTORE.serialize_cdr(_TYPESTORE.types[STRING_TYPE](data=data), STRING_TYPE))


def write_demo_bag(out: Path, seed: int = DEFAULT_SEED, duration_s: float = DEFAULT_DURATION_S,
                   rate_hz: float = DEFAULT_RATE_HZ, force: bool = False, progress: bool = True) -> bool:
    """Write the bag directory ``out``; return False if an identical one was already there.

    Raises FileExistsError if ``out`` holds something else and ``force`` is not set.
    """
    out = Path(out)
    params = {"format_version": FORMAT_VERSION, "seed": seed, "duration_s": float(duration_s),
              "rate_hz": float(rate_hz), "jpeg_quality": JPEG_QUALITY}
    params_path = out / "params.json"
    if out.exists():
        if params_path.exists() and json.loads(params_path.read_text()) == params and not force:
            return False
        if not force:
            raise FileExistsError(f"{out} exists and was not made with these parameters; use --force")
        shutil.rmtree(out)
    episode = generate_episode(seed, duration_s)
    questions = generate_questions(episode, seed)
    ids = [f"q{i:03d}" for i in range(len(questions))]
    n_frames = int(np.ceil(duration_s * rate_hz - 1e-9))
    with Writer(out, version=Writer.VERSION_LATEST, storage_plugin=StoragePlugin.MCAP) as writer:
        images = writer.add_connection(IMAGE_TOPIC, IMAGE_TYPE, typestore=_TYPESTORE)
        queries = writer.add_connection(QUERY_TOPIC, STRING_TYPE, typestore=_TYPESTORE)
        pending = list(zip(ids, questions))
        frames = episode.frames(rate_hz)
        for t, rgb in tqdm(frames, total=n_frames, unit="frame", disable=not progress, desc="demo bag"):
            # Messages go in time order; question times never equal frame times.
            while pending and pending[0][1].t < t:
                qid, q = pending.pop(0)
                writer.write(queries, _stamp(q.t), _query_message(qid, q))
            writer.write(images, _stamp(t), _image_message(rgb, _stamp(t)))
        for qid, q in pending:
            writer.write(queries, _stamp(q.t), _query_message(qid, q))
    sidecar = [{"id": qid, "t": q.t, "family": q.family, "question": q.text, "answer": q.answer}
               for qid, q in zip(ids, questions)]
    (out / "questions.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    params_path.write_text(json.dumps(params, indent=1) + "\n")  # last: marks the bag complete
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="bag directory to create")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="world seed (>= 0)")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="seconds of stream")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE_HZ, help="camera frame rate, Hz")
    parser.add_argument("--force", action="store_true", help="overwrite an existing bag directory")
    args = parser.parse_args(argv)
    try:
        written = write_demo_bag(args.out, args.seed, args.duration, args.rate, args.force)
    except FileExistsError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{'wrote' if written else 'up to date:'} {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
