"""One bounded-cache session per camera, all on one loaded model.

Frames of different cameras never mix in one cache: nothing in the prompt says which camera a
frame came from, so one shared stream would answer "what is in view?" about whichever camera fed
last, and a question about the left camera could be answered from the right one. The model's
weights are loaded once and shared; each camera costs only its own cache (bounded by the policy).
Knows nothing of ROS.
"""

from __future__ import annotations

from infmllm_ros.engine.session import SessionConfig, StreamingSession


class UnknownCamera(KeyError):
    """A question names a camera the node does not watch."""


class CameraSessions:
    """Sessions by camera name, in the order the cameras were listed.

    A question that names no camera is about the first listed camera that has fed a frame (with
    one live camera, that one), or the first listed one when none has.
    """

    def __init__(self, config: SessionConfig, cameras: list[str]) -> None:
        if not cameras:
            raise ValueError("no camera to watch")
        first = StreamingSession(config)   # loads the model (ModelLoadError, ValueError)
        self.sessions = {cameras[0]: first}
        for camera in cameras[1:]:
            self.sessions[camera] = StreamingSession(config, model=first.model, processor=first.processor)
        self.default_camera = cameras[0]
        self.config = first.config   # AUTO sizes resolved
        self.frame_tokens = first.frame_tokens
        self.family = first.family
        self.model = first.model

    def session(self, camera: str | None) -> tuple[str, StreamingSession]:
        """(camera, its session); camera None means the default camera (see the class)."""
        if camera is None:
            camera = next((name for name, session in self.sessions.items() if session.frames_seen),
                          self.default_camera)
        try:
            return camera, self.sessions[camera]
        except KeyError:
            raise UnknownCamera(camera) from None

    def reset(self) -> int:
        """Empty every camera's cache and conversation; returns the frames forgotten."""
        forgotten = self.frames_seen
        for session in self.sessions.values():
            session.reset()
        return forgotten

    @property
    def frames_seen(self) -> int:
        return sum(session.frames_seen for session in self.sessions.values())

    @property
    def cache_tokens(self) -> int:
        return sum(session.cache_tokens for session in self.sessions.values())

    @property
    def cache_bytes(self) -> int:
        return sum(session.cache_bytes for session in self.sessions.values())

    @property
    def recall_store_bytes(self) -> int:
        stores = (session.cache.store for session in self.sessions.values())
        return sum(store.bytes for store in stores if store is not None)

    @property
    def recall_frames_stored(self) -> int:
        stores = (session.cache.store for session in self.sessions.values())
        return sum(len(store) for store in stores if store is not None)

    def newest_stamps(self) -> dict[str, float | None]:
        return {camera: session.newest_frame_stamp for camera, session in self.sessions.items()}
