"""sensor_msgs Image / CompressedImage -> H x W x 3 uint8 RGB, or one ImageConversionError with a kind.

Messages are duck-typed (rclpy messages, rosbags messages, anything with the same fields), and
`data` may be bytes, array.array or a numpy array. Every size is checked before any pixel is
touched, so a malformed or enormous message costs nothing.

Backends, and why:
- rgb8, bgr8, rgba8, bgra8, mono8 are converted with numpy: they are plain channel reorderings of
  a strided view, identical on every machine and cheaper than any library call. rosbags-image would
  do the same work with its own message classes, so it adds nothing here.
- Other raw encodings (yuv422, bayer, 16-bit...) go to cv_bridge when it is importable (a robot
  with ROS installed); without it they are refused as unknown. Never the PyPI `cv-bridge`.
- JPEG / PNG are decoded with Pillow: it reads the header first (so the pixel limit is enforced
  before decompressing) and, unlike OpenCV's imdecode, refuses a truncated JPEG instead of
  returning a half-grey frame.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image as PILImage

# Kinds of bad input, as counted in ~/stats.
KINDS = EMPTY, BAD_LAYOUT, TOO_LARGE, UNKNOWN_ENCODING, CORRUPT = (
    "empty", "bad_layout", "too_large", "unknown_encoding", "corrupt")

# encoding -> (channels, indices of R, G, B); mono8 is replicated into three channels.
ENCODINGS: dict[str, tuple[int, tuple[int, int, int]]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, (0, 0, 0)),
}
DEFAULT_MAX_PIXELS = 3840 * 2160

try:  # on a robot with ROS installed; never the PyPI package of the same name
    from cv_bridge import CvBridge, CvBridgeError
    _BRIDGE = CvBridge()
except ImportError:
    _BRIDGE = None


class ImageConversionError(ValueError):
    """An image message that cannot become a frame; `kind` is one of KINDS (for stats)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _bytes_view(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:  # a list of ints (rare: hand-built messages)
        return np.asarray(data, dtype=np.uint8)


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise ImageConversionError(EMPTY, f"image is {width}x{height}")
    if width * height > max_pixels:
        raise ImageConversionError(TOO_LARGE, f"image is {width}x{height} = {width * height} pixels, "
                                              f"more than max_image_pixels ({max_pixels})")


def image_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A sensor_msgs/Image as a new C-contiguous H x W x 3 uint8 RGB array."""
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    _check_size(width, height, max_pixels)
    encoding = str(msg.encoding)
    if encoding not in ENCODINGS:
        return _other_encoding(msg, encoding)
    channels, order = ENCODINGS[encoding]
    row_bytes = width * channels
    if step < row_bytes:
        raise ImageConversionError(BAD_LAYOUT, f"step {step} is less than width x channels = {row_bytes} "
                                               f"for {width} px of {encoding}")
    data = _bytes_view(msg.data)
    if data.size != step * height:
        raise ImageConversionError(BAD_LAYOUT, f"data is {data.size} bytes, expected step x height = "
                                               f"{step} x {height} = {step * height}")
    pixels = data.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    return np.ascontiguousarray(pixels[:, :, list(order)])


def _other_encoding(msg, encoding: str) -> np.ndarray:
    if _BRIDGE is None:
        raise ImageConversionError(UNKNOWN_ENCODING, f"encoding {encoding!r} is not one of {sorted(ENCODINGS)} "
                                                     "(install cv_bridge for more)")
    try:
        rgb = _BRIDGE.imgmsg_to_cv2(msg, desired_encoding="rgb8")
    except (CvBridgeError, TypeError, ValueError) as error:
        raise ImageConversionError(UNKNOWN_ENCODING, f"cv_bridge cannot convert {encoding!r}: {error}") from error
    return np.ascontiguousarray(rgb, dtype=np.uint8)


def compressed_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A sensor_msgs/CompressedImage (JPEG or PNG) as an H x W x 3 uint8 RGB array."""
    fmt = str(getattr(msg, "format", "")).lower()
    if "compresseddepth" in fmt:
        raise ImageConversionError(UNKNOWN_ENCODING, f"format {msg.format!r}: depth images are not camera frames")
    data = _bytes_view(msg.data)
    if data.size == 0:
        raise ImageConversionError(EMPTY, "compressed image has no data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)  # our own limit applies below
        try:
            image = PILImage.open(io.BytesIO(data.tobytes()), formats=["JPEG", "PNG"])
        except PILImage.DecompressionBombError as error:
            raise ImageConversionError(TOO_LARGE, str(error)) from error
        except (OSError, ValueError, SyntaxError) as error:  # UnidentifiedImageError is an OSError
            raise ImageConversionError(CORRUPT, f"data (format {msg.format!r}) is not a readable JPEG or PNG: "
                                                f"{error}") from error
        _check_size(*image.size, max_pixels)
        try:
            rgb = image.convert("RGB")
        except (OSError, ValueError, SyntaxError) as error:
            raise ImageConversionError(CORRUPT, f"{image.format} data is corrupt: {error}") from error
    return np.array(rgb, dtype=np.uint8)


def stamp_seconds(msg) -> float:
    """header.stamp as float seconds (0.0 when the message has no header)."""
    header = getattr(msg, "header", None)
    if header is None:
        return 0.0
    return int(header.stamp.sec) + int(header.stamp.nanosec) * 1e-9
