"""A generation request as the engine tracks it (plain Python, no protobuf)."""
from __future__ import annotations

import enum
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from ninfer_common.constraint_kind import ConstraintKind
from ninfer_common.errors import RowError


class FinishReason(enum.StrEnum):
    """Why a request ended (``ninfer.v1.FinishReason``)."""

    STOP = "stop"
    LENGTH = "length"
    ERROR = "error"
    CANCELLED = "cancelled"
    TOOL_CALLS = "tool_calls"  # EOS after one or more tool calls


class SpecMethod(enum.StrEnum):
    """A speculative method; the value is its CLI / log spelling (``"early-exit"``).

    Drafter factories: :data:`gpu_engine.spec.registry.DRAFTERS`."""

    NONE = "none"
    NGRAM = "ngram"
    EARLY_EXIT = "early-exit"
    EARLY_EXIT_SAMPLED = "early-exit-sampled"


class CacheStatus(enum.StrEnum):
    """Compile-cache outcome of Prepare (``ninfer.v1.CacheStatus``)."""

    HIT = "hit"
    BUILT = "built"
    WAITED = "waited"


@dataclass
class SamplingOptions:
    """Per-request sampling parameters (validated by the server).

    Attributes:
        temperature: softmax temperature; 0 = greedy.
        top_k: keep the k most likely legal tokens; 0 = off.
        top_p: nucleus mass in (0, 1]; 1 = off.
        min_p: relative probability floor in [0, 1); 0 = off.
        seed: 63-bit random seed; draws depend on (seed, output position) only.
        presence_penalty: additive penalty per distinct generated token.
        frequency_penalty: additive penalty per generated occurrence.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass
class ConstraintRef:
    """The request's body constraint as sent to the sidecar."""

    kind: ConstraintKind | None  # None: no body, only the output wrapper (tools / thinking)
    source: str = ""
    choices: tuple[str, ...] = ()
    prefix: bytes = b""  # assistant text the output continues (re-prepared with it after a sidecar restart)
    wrapper: str = ""  # the output plan's grammar_key() (thinking stage / tool calls), "" = plain body

    @property
    def label(self) -> str:
        """Kind name for results and metrics: the body kind, else ``tools`` / ``thinking``."""
        if self.kind is not None:
            return str(self.kind)
        return "tools" if '"declared":0' not in self.wrapper else "thinking"


@dataclass
class ConstraintResult:
    """The constraint's outcome, reported with :class:`Finish`.

    Attributes:
        kind: the constraint kind.
        complete: the committed output is a complete sentence of the language.
        terminated: EOS was accepted.
        cache: compile-cache outcome of Prepare, None if unknown.
        prepare_seconds: seconds spent in the sidecar's Prepare.
        mask_positions: bitmask positions computed for the request.
    """

    kind: ConstraintKind | str
    complete: bool = False
    terminated: bool = False
    cache: CacheStatus | None = None
    prepare_seconds: float = 0.0
    mask_positions: int = 0
    branch: str = ""  # "undecided" / "content" / "tools" for turns with an output plan


@dataclass
class Finish:
    """Terminal state of a request (published as the stream's last message).

    ``error`` is set exactly when ``finish_reason`` is ERROR.
    """

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    constraint: ConstraintResult | None = None
    error: RowError | None = None
    reasoning: str | None = None  # the reasoning text (None: no thinking stage)
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # [{"id", "name", "arguments_json"}]


@dataclass
class Delta:
    """Streamed output: new text (complete UTF-8) and the token ids behind it.

    ``channel``: ``"content"``, ``"reasoning"`` or ``"tool_call"`` (raw call wire text); ``call_index``:
    the call's index in the turn; ``call``: ``{"id", "name", "arguments_json"}`` when this delta completes one.
    """

    text: str
    token_ids: list[int]
    channel: str = "content"
    call_index: int = 0
    call: dict[str, str] | None = None


@dataclass
class Request:
    """Engine-side state of one request.

    Attributes:
        request_id: unique id (logs, traces, sidecar session key).
        prompt_ids: rendered prompt token ids.
        max_tokens: generation budget in tokens.
        sampling: sampling parameters.
        constraint: body constraint, or None.
        spec_method: speculative method for this request ("none", "ngram", "early-exit", "early-exit-sampled").
        num_draft_tokens: K for this request (<= the engine's ring K).
        events: queue of :class:`Delta` / :class:`Finish` for the servicer.
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingOptions
    constraint: ConstraintRef | None = None
    spec_method: SpecMethod = SpecMethod.NONE
    num_draft_tokens: int = 0
    events: "queue.Queue[Delta | Finish]" = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # set by the engine
    lane: int = -1
    num_cached: int = 0  # tokens whose KV is in the lane
    output_ids: list[int] = field(default_factory=list)
    pending_commit: list[int] = field(default_factory=list)  # committed here, not yet confirmed to the sidecar
    unpublished: list[int] = field(default_factory=list)  # committed ids whose Delta is not out yet (CUDA: the
    # engine publishes them while the next step's forward runs, gpu_engine.engine.output.OutputPublishing)
    constraint_info: dict[str, Any] = field(default_factory=dict)  # {"cache": CacheStatus, "prepare_seconds": s}
    sidecar_generation: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    finished: bool = False
    parked: bool = False  # waiting for a restarted sidecar (gpu_engine.engine.supervision); keeps its lane
    detok: Any = None  # IncrementalDetokenizer, set at admission
    submitted_s: float = 0.0  # time.monotonic() when the engine received it (queue-wait metric)
    trace_context: Any = None  # the request span's OpenTelemetry SpanContext (engine step spans link to it)
    output: Any = None  # ninfer_common.frontends.stream.OutputStream for chat turns with tools / thinking
    output_result: Any = None  # its StreamResult, set when the request finishes
    draft_context: Any = None  # drafter-owned scratch (the n-gram drafter's token buffer, gpu_engine.spec.drafters)

    def cancel(self) -> None:
        """Ask the engine to stop this request (takes effect at the next step)."""
        self.cancelled.set()
