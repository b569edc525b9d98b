"""A real in-process gRPC server with a *fake* Generation servicer.

The servicer's behaviour is chosen by the prompt (or the last chat message):

* ``"reject-grammar"`` / an invalid ``regex`` ``"("``: abort with
  INVALID_ARGUMENT and a packed ErrorDetail (exactly as the real server will).
* ``"unavailable"``: abort with UNAVAILABLE + detail ConstraintServiceUnavailable.
* ``"internal"``: abort with INTERNAL and no detail.
* ``"runtime-error"``: one delta, then a FINISH_REASON_ERROR finish.
* ``"length"``: deltas then FINISH_REASON_LENGTH (an echoed constraint is not complete).
* ``"length-empty"``: FINISH_REASON_LENGTH without any content (e.g. a tool call cut at max_tokens).
* ``"slow"``: one delta every 50 ms until cancelled (records cancellation).
* ``"no-finish"``: deltas and the stream ends without a finish.
* anything else: deltas ``"Hel"``, ``"lo"``, ``" wor"``, ``"ld"`` + STOP.

A constraint in the request is echoed back in ``finish.constraint``.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from ninfer_common.grpc_status import make_rpc_status  # noqa: E402
from ninfer.v1 import generation_pb2 as pb  # noqa: E402
from ninfer.v1 import generation_pb2_grpc as pb_grpc  # noqa: E402

DELTAS = ["Hel", "lo", " wor", "ld"]


class FakeGeneration(pb_grpc.GenerationServicer):
    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []
        self.metadata: list[dict] = []
        self.cancelled = threading.Event()

    @staticmethod
    def _text(req) -> str:
        if req.WhichOneof("input") == "chat":
            return req.chat.messages[-1].content if req.chat.messages else ""
        return req.prompt

    def Generate(self, request, context):  # noqa: N802
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        text = self._text(request).strip()
        kind = request.constraint.WhichOneof("kind")
        if text == "reject-grammar":
            context.abort_with_status(
                make_rpc_status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.ErrorDetail(code="INVALID_ARGUMENT", kind="InvalidGrammar", message="expected '::='", location="1:7"),
                )
            )
        if kind == "regex" and request.constraint.regex == "(":
            context.abort_with_status(
                make_rpc_status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.ErrorDetail(kind="InvalidRegex", message="unbalanced parenthesis", location="1:2"),
                )
            )
        if kind == "choice" and not request.constraint.choice.options:
            context.abort_with_status(
                make_rpc_status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.ErrorDetail(kind="InvalidChoice", message="empty choice list"),
                )
            )
        if text == "unavailable":
            context.abort_with_status(
                make_rpc_status(
                    grpc.StatusCode.UNAVAILABLE,
                    pb.ErrorDetail(kind="ConstraintServiceUnavailable", message="sidecar down"),
                )
            )
        if text == "internal":
            context.abort(grpc.StatusCode.INTERNAL, "boom")

        constraint = None
        if kind is not None:
            cut = text in ("length", "length-empty")  # cut at max_tokens: the output does not complete it
            constraint = pb.ConstraintResult(
                kind=kind, complete=not cut, terminated=not cut, cache=pb.CACHE_STATUS_BUILT, prepare_seconds=0.25
            )

        if text == "slow":
            # The server stops iterating this generator once the client cancels,
            # so record the cancellation from the termination callback.
            done = threading.Event()
            context.add_callback(lambda: None if done.is_set() else self.cancelled.set())
            for n in range(200):
                if not context.is_active():
                    break
                yield pb.GenerateResponse(text="x", token_ids=[n])
                time.sleep(0.05)
            else:
                done.set()
            return
        if text == "runtime-error":
            yield pb.GenerateResponse(text="par", token_ids=[1])
            yield pb.GenerateResponse(
                finish=pb.Finish(
                    finish_reason=pb.FINISH_REASON_ERROR,
                    usage=pb.Usage(prompt_tokens=3, completion_tokens=1),
                    error=pb.ErrorDetail(code="INTERNAL", kind="IntegrityError", message="row mismatch"),
                )
            )
            return

        if request.tools:
            # Reasoning (when thinking is on), then one call per allowed name
            # (or the first declared tool), echoing the tool's name.
            if request.thinking.enabled:
                yield pb.GenerateResponse(text="let me ", token_ids=[1], channel=pb.CHANNEL_REASONING)
                yield pb.GenerateResponse(text="think", token_ids=[2], channel=pb.CHANNEL_REASONING)
            names = list(request.tool_choice.allowed_names) or [request.tools[0].name]
            finish = pb.Finish(finish_reason=pb.FINISH_REASON_TOOL_CALLS, usage=pb.Usage(prompt_tokens=7, completion_tokens=9))
            for i, name in enumerate(names):
                call = pb.ToolCall(id=f"call_{i}", name=name, arguments_json='{"city":"Paris"}')
                wire = f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "Paris"}}}}\n</tool_call>'
                yield pb.GenerateResponse(text=wire[:11], token_ids=[3], channel=pb.CHANNEL_TOOL_CALL, tool_call_index=i)
                yield pb.GenerateResponse(
                    text=wire[11:], token_ids=[4], channel=pb.CHANNEL_TOOL_CALL, tool_call_index=i, tool_call=call
                )
                finish.tool_calls.append(call)
            if request.thinking.enabled:
                finish.reasoning = "let me think"
            yield pb.GenerateResponse(finish=finish)
            return

        for i, d in enumerate(DELTAS if text != "length-empty" else []):
            yield pb.GenerateResponse(text=d, token_ids=[10 + i])
        if text == "no-finish":
            return
        reason = pb.FINISH_REASON_LENGTH if text in ("length", "length-empty") else pb.FINISH_REASON_STOP
        finish = pb.Finish(
            finish_reason=reason,
            usage=pb.Usage(prompt_tokens=5, completion_tokens=4, draft_tokens=6, accepted_draft_tokens=2),
        )
        if constraint is not None:
            finish.constraint.CopyFrom(constraint)
        yield pb.GenerateResponse(finish=finish)

    def CountTokens(self, request, context):  # noqa: N802
        if request.WhichOneof("input") == "chat":
            n = sum(len(m.content.split()) + 2 for m in request.chat.messages)
        else:
            n = len(request.prompt.split())
        return pb.CountTokensResponse(num_tokens=n, max_context_tokens=2048)


class FakeServer:
    def __init__(self) -> None:
        self.servicer = FakeGeneration()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_GenerationServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set("ninfer.v1.Generation", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


@pytest.fixture(scope="module")
def fake_server():
    srv = FakeServer()
    yield srv
    srv.stop()


@pytest.fixture
def dead_target() -> str:
    """An address where nothing listens."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"
