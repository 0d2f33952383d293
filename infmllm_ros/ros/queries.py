"""Questions as they arrive on ~/query: decoded, parsed, or refused with a reason.

A query is plain text, or JSON {"id": ..., "question": ...} so that a caller can match the answer;
plain text gets a generated id. A JSON id comes back as it was sent (an integer stays an integer).
"""

from __future__ import annotations

import itertools
import json
import re
import struct
import time
from dataclasses import dataclass, field

# Kinds of refusal, as counted in ~/stats and written in ~/answer_info.
KINDS = EMPTY, TOO_LONG, NOT_UTF8, BAD_JSON, MALFORMED, BUSY = (
    "empty", "too_long", "not_utf8", "bad_json", "malformed", "busy")
DEFAULT_MAX_CHARS = 2000
MAX_ID_CHARS = 200
ECHO_CHARS = 200  # how much of a refused question ~/answer_info repeats back
# Texts longer than 2 * max_chars + this are refused unparsed; shorter ones are parsed first, so a
# JSON query whose question is too long still gets its refusal under its own id.
_JSON_OVERHEAD_CHARS = 1024

_PEEK_CHARS = 4096
_ID_NEAR_START = re.compile(r'"id"\s*:\s*(?:(?P<number>-?\d{1,30})\b|(?P<string>"(?:[^"\\]|\\.){0,400}"))')

# CDR encapsulation ids whose std_msgs/String layout is uint32 length + bytes + NUL (XCDR1 and
# XCDR2 plain, big and little endian).
_PLAIN_CDR = {b"\x00\x00": ">", b"\x00\x01": "<", b"\x00\x06": ">", b"\x00\x07": "<"}


@dataclass(frozen=True)
class Query:
    id: str | int
    question: str
    camera: str | None = None   # the camera the question is about (JSON "camera"); None: the default one
    received: float = field(default_factory=time.monotonic)  # for queue + answer latency


class QueryRejected(ValueError):
    """A query that will get a refusal, not an answer; `kind` is one of KINDS."""

    def __init__(self, kind: str, reason: str, query_id: str | int | None = None, question: str = "") -> None:
        super().__init__(reason)
        self.kind, self.reason, self.query_id = kind, reason, query_id
        self.question = echo(question)


def echo(question: str) -> str:
    """A question short enough to repeat in a reply."""
    return question if len(question) <= ECHO_CHARS else question[:ECHO_CHARS] + "..."


class QueryIds:
    """Ids for queries that came without one: 'auto-1', 'auto-2', ... (thread-safe)."""

    def __init__(self, prefix: str = "auto") -> None:
        self._prefix, self._counter = prefix, itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"


def decode_string_cdr(raw: bytes) -> str | None:
    """The text of a serialized std_msgs/String, strictly UTF-8; None for an encapsulation not known here.

    Needed because rclpy decodes String.data with errors='replace': a typed subscription cannot tell
    a sender's invalid bytes from a real U+FFFD, so the node subscribes raw and decodes here.
    """
    endian = _PLAIN_CDR.get(bytes(raw[:2]))
    if endian is None:
        return None
    if len(raw) < 8:
        raise QueryRejected(MALFORMED, f"serialized String is {len(raw)} bytes, too short")
    (length,) = struct.unpack(endian + "I", raw[4:8])
    if length < 1 or 8 + length > len(raw):
        raise QueryRejected(MALFORMED, f"serialized String claims {length} bytes but carries {len(raw) - 8}")
    try:
        return bytes(raw[8:8 + length - 1]).decode("utf-8")
    except UnicodeDecodeError as error:
        raise QueryRejected(NOT_UTF8, f"query is not valid UTF-8 ({error.reason} at byte {error.start})") from None


def parse_query(text: str, ids: QueryIds, max_chars: int = DEFAULT_MAX_CHARS) -> Query:
    """A Query from ~/query text, or QueryRejected with the reason."""
    if len(text) > 2 * max_chars + _JSON_OVERHEAD_CHARS:
        raise QueryRejected(TOO_LONG, f"query is {len(text)} characters; max_query_chars is {max_chars}",
                            _peek_id(text) if text.lstrip().startswith("{") else ids(), text)
    query_id, question, camera = None, text, None
    if text.lstrip().startswith("{"):
        query_id, question, camera = _parse_json(text, ids)
    if query_id is None:
        query_id = ids()
    if not question.strip():
        raise QueryRejected(EMPTY, "question is empty", query_id)
    if len(question) > max_chars:
        raise QueryRejected(TOO_LONG, f"question is {len(question)} characters; max_query_chars is {max_chars}",
                            query_id, question)
    return Query(query_id, question.strip(), camera)


def _peek_id(text: str) -> str | int | None:
    """The "id" of a JSON query too long to parse, read from its first characters only.

    A regular expression over a bounded prefix, not json.loads, so a multi-megabyte message cannot
    stall the callback; an id that is not near the start (or not a plain string or integer) is
    not found, and the refusal then goes out under a generated id.
    """
    match = _ID_NEAR_START.search(text, 0, _PEEK_CHARS)
    if match is None:
        return None
    if match.group("number") is not None:
        return int(match.group("number"))
    try:
        query_id = json.loads(match.group("string"))
    except json.JSONDecodeError:
        return None
    return query_id if query_id and len(query_id) <= MAX_ID_CHARS else None


def _parse_json(text: str, ids: QueryIds) -> tuple[str | int | None, str, str | None]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise QueryRejected(BAD_JSON, f"query starts with '{{' but is not JSON: {error}", ids(), text) from None
    if not isinstance(data, dict):
        raise QueryRejected(BAD_JSON, 'JSON query must be an object {"id": ..., "question": ...}', ids(), text)
    query_id = data.get("id")
    if query_id is not None and (isinstance(query_id, bool) or not isinstance(query_id, (str, int))):
        raise QueryRejected(BAD_JSON, f'"id" must be a string or an integer, not {query_id!r}', ids(), text)
    if query_id == "":
        query_id = None
    if query_id is not None and len(str(query_id)) > MAX_ID_CHARS:
        raise QueryRejected(BAD_JSON, f'"id" is longer than {MAX_ID_CHARS} characters', ids(), text)
    question = data.get("question")
    if not isinstance(question, str):
        raise QueryRejected(BAD_JSON, 'JSON query needs a "question" string', _or_new(query_id, ids), text)
    camera = data.get("camera")
    if camera is not None and (not isinstance(camera, str) or not camera.strip()):
        raise QueryRejected(BAD_JSON, '"camera" must be a topic name string', _or_new(query_id, ids), text)
    return query_id, question, camera


def _or_new(query_id: str | int | None, ids: QueryIds) -> str | int:
    return ids() if query_id is None else query_id
