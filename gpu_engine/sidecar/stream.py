"""The engine's ``Step`` stream to one sidecar generation, with a deadline on every answer.

gRPC's response iterator blocks in ``next()`` until an answer or an error arrives: a hung (e.g.
SIGSTOPped) sidecar would block the engine thread forever. A reader thread moves every answer (or
the stream's end) into a queue instead; :meth:`StepStream.recv` waits on that queue with a timeout,
so the engine notices a hung sidecar within the deadline (issue 14 (3)).
"""
from __future__ import annotations

import queue
import threading

import grpc

from ninfer.constraint.v1 import constraint_pb2 as pb


class StreamBroken(Exception):
    """The stream ended, failed, or did not answer within the deadline (``str``: why, no Python repr)."""


class StepStream:
    """One bidirectional ``Step`` call of one sidecar generation.

    Args:
        stub: a ``ConstraintServiceStub`` on the generation's channel.
        generation: the sidecar generation this stream belongs to (sessions live in one generation).
    """

    def __init__(self, stub, generation: int) -> None:
        self.generation = generation
        self._requests: "queue.Queue[pb.StepRequest | None]" = queue.Queue()
        self._answers: "queue.Queue[pb.StepResponse | StreamBroken]" = queue.Queue()
        self.broken: str = ""  # why the stream is unusable ("" while it is fine)
        self._call = stub.Step(iter(self._requests.get, None))
        threading.Thread(target=self._read, name=f"ninfer-step-reader-{generation}", daemon=True).start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self._answers.put(answer)
            why = "the sidecar ended the stream"
        except grpc.RpcError as e:
            # str(RpcError) is the call object's repr (``<_MultiThreadedRendezvous ...>``): never shown to clients
            why = f"{e.code().name}: {e.details()}" if hasattr(e, "code") else "the Step stream failed"
        except Exception as e:  # noqa: BLE001 - any reader failure breaks the stream, never the engine
            why = f"the Step stream failed ({type(e).__name__})"
        self._answers.put(StreamBroken(why))

    def send(self, msg: pb.StepRequest) -> None:
        """Queue ``msg`` for sending (non-blocking).

        Raises:
            StreamBroken: the stream is known to be broken.
        """
        if self.broken:
            raise StreamBroken(self.broken)
        self._requests.put(msg)

    def recv(self, timeout_s: float) -> pb.StepResponse:
        """The next answer, waiting at most ``timeout_s`` seconds.

        Raises:
            StreamBroken: the stream broke, or no answer came within ``timeout_s`` (the stream is then
                marked broken: a late answer could not be matched to its step any more).
        """
        if self.broken:
            raise StreamBroken(self.broken)
        try:
            got = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            self.broken = f"no Step answer within {timeout_s:g} s (the sidecar is hung or overloaded)"
            raise StreamBroken(self.broken) from None
        if isinstance(got, StreamBroken):
            self.broken = str(got)
            raise got
        return got

    def close(self) -> None:
        """End the request side (the call ends when its channel closes)."""
        self.broken = self.broken or "the stream was closed"
        self._requests.put(None)
        self._call.cancel()
