"""The local transport of the engine↔sidecar ``Step`` stream: the same protobuf messages, framed on a
unix stream socket next to the sidecar's gRPC socket (DESIGN.md "The hot path"; issue 12).

Why: the ``Step`` round trip is on every constrained decode step's critical path, and gRPC's Python
stream costs three thread hand-offs on it — 0.65–0.8 ms per round trip on the H200 host after the
sending hand-off was tightened (README "Where a constrained decode step's time goes"), against
0.2–0.3 ms for the sidecar's own work at B = 1. On this socket the engine thread writes the message and
reads the answer itself, and the sidecar's per-connection thread reads and answers it: no thread hop
in either process (``bench/step_stream_bench.py`` measures both transports).

What stays the same: the messages (``ninfer.constraint.v1`` ``StepRequest`` / ``StepResponse``), their
order (one stream, answers in order), the sidecar's handler, the engine's deadlines, and every other
RPC (``Prepare``, ``Close``, health, registration), which stays on gRPC. The gRPC ``Step`` RPC stays
too: the engine falls back to it when the socket is absent (an external sidecar on TCP, an older one)
or when asked (``ninfer serve --step-transport grpc``).

Framing: :class:`multiprocessing.connection.Connection` (a 4-byte length prefix per message), each
payload one kind byte (:data:`FRAME_MESSAGE`, :data:`FRAME_ERROR`) and then the serialized message or a
UTF-8 reason. The sidecar sends :data:`FRAME_ERROR` instead of an answer when it cannot serve the
stream (e.g. a lost shard worker) and closes it; the engine treats that as a broken stream, like a
gRPC error status on the ``Step`` RPC.

Access: the socket is made mode 0600 in the same directory as the gRPC socket (the engine's private
0700 directory by default), and the engine checks the peer with ``SO_PEERCRED`` as for gRPC.
"""
from __future__ import annotations

#: The step socket's path is the gRPC socket's path plus this suffix.
STEP_SOCKET_SUFFIX = ".step"
#: First byte of a frame: a serialized protobuf message follows.
FRAME_MESSAGE = b"\x00"
#: First byte of a frame: a UTF-8 reason follows; the sender closes the stream after it.
FRAME_ERROR = b"\x01"
#: Largest frame either side accepts (bytes), as the gRPC channels' message limit.
MAX_FRAME_BYTES = 64 << 20
#: The transports of the Step stream (``--step-transport``).
STEP_TRANSPORTS = ("socket", "grpc")


def step_socket_path(grpc_socket_path: str) -> str:
    """The step socket of the sidecar serving gRPC on the unix socket ``grpc_socket_path``."""
    return grpc_socket_path + STEP_SOCKET_SUFFIX


def error_frame(why: str) -> bytes:
    """A :data:`FRAME_ERROR` frame carrying ``why``."""
    return FRAME_ERROR + why.encode("utf-8", "replace")


def parse_frame(frame: bytes) -> tuple[bool, bytes | str]:
    """``(True, message bytes)`` for a message frame, ``(False, reason)`` for an error frame.

    Raises:
        ValueError: an empty frame or an unknown kind byte.
    """
    kind = frame[:1]
    if kind == FRAME_MESSAGE:
        return True, frame[1:]
    if kind == FRAME_ERROR:
        return False, frame[1:].decode("utf-8", "replace")
    raise ValueError(f"unknown Step frame kind {kind!r}")
