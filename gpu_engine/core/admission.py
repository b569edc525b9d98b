"""Admission: a validated :class:`GenerateParams` -> a prepared engine :class:`Request` (seed 000 §3).

Runs on the caller's thread (a gRPC worker, an HTTP handler), never on the
engine worker: validate, render and tokenise the prompt, check the context
and speculative limits, and Prepare the constraint in the sidecar (compile or
cache hit + output session). Only then is the request queued.
"""
from __future__ import annotations

import hashlib
import uuid

from ninfer_common.errors import ErrorKind, RequestError, Status

from gpu_engine.core.params import GenerateParams
from gpu_engine.core.request import ConstraintRef, Request, SamplingOptions, SpecMethod

__all__ = ["Admission", "PROMPT_BYTES_SLACK"]

# Factor on ``max_seq_len * longest token bytes`` for the byte limit of a prompt (see Admission).
PROMPT_BYTES_SLACK = 4


class Admission:
    """Turns :class:`GenerateParams` into prepared :class:`Request` objects for one engine.

    Args:
        engine: the running :class:`gpu_engine.engine.Engine` (its executor's context limit,
            speculative defaults and sidecar are read).
        frontend: the model's :class:`gpu_engine.frontend.Frontend` (template + tokenizer).
        default_max_tokens: budget when a request gives 0.
    """

    def __init__(self, engine, frontend, default_max_tokens: int = 256, chat_output=None) -> None:
        self.engine = engine
        self.frontend = frontend
        self.default_max_tokens = default_max_tokens
        # Issue 14 (7): a prompt longer than this many bytes cannot fit the context whatever its
        # tokenisation (every token covers at most ``longest`` bytes; x4 leaves room for tokenizer
        # normalisation), so it is refused before the tokenizer ever sees it.
        longest = max((len(b) for b in engine.vocab.token_bytes), default=1)
        self.max_prompt_bytes = engine.program.max_seq_len * max(1, longest) * PROMPT_BYTES_SLACK
        #: :class:`gpu_engine.frontend.output.ChatOutputFrontend` (tools / thinking), None = plain chat only
        self.chat_output = chat_output

    def plan(self, params: GenerateParams):
        """``(prompt ids, OutputPlan)`` of a chat turn that leaves the plain path (tools, tool turns, a
        thinking request, or a family whose default has a thinking stage); None otherwise.

        Raises:
            RequestError: tools / thinking without chat input or on a server without a tool frontend, and
                every plan rejection (located, e.g. ``/tools/1/function/parameters/properties/days``).
        """
        from ninfer_common.frontends.plan import ThinkingRequest

        wants = bool(params.tools) or params.tool_choice is not None or params.thinking is not None
        if params.messages is None:
            if wants:
                raise RequestError(ErrorKind.INVALID_REQUEST, "tools and thinking need chat input (`chat`), "
                                   "not `prompt`", "/tools")
            return None
        msgs = [m.as_template_dict() for m in params.messages]
        co = self.chat_output
        thinking = params.thinking or ThinkingRequest()
        if co is None:
            if wants or any(m.tool_calls or m.role == "tool" for m in params.messages):
                raise RequestError(ErrorKind.INVALID_REQUEST, "this server's model has no tool / thinking frontend",
                                   "/tools")
            return None
        if not co.needs_plan(params.tools, params.tool_choice, thinking, msgs):
            return None
        c = params.constraint
        return co.prepare(msgs, params.tools, params.tool_choice, thinking, None if c is None else str(c.kind),
                          None if c is None else c.source, continue_final=params.continue_final_message)

    def encode(self, params: GenerateParams) -> list[int]:
        """Prompt token ids of ``params`` (chat rendered with the template).

        Raises:
            RequestError: ``InvalidRequest`` (no input, a prompt too large for the context — checked on
                its UTF-8 byte length before tokenising —, template failure, control-token spelling).
        """
        self._check_size(params)
        if params.messages is not None:
            msgs = [{"role": m.role, "content": m.content} for m in params.messages]
            return self.frontend.encode_chat(msgs, continue_final=params.continue_final_message)
        if params.prompt is None:
            raise RequestError(ErrorKind.INVALID_REQUEST, "expected one of `prompt` or `chat`, got neither")
        return self.frontend.encode_prompt(params.prompt)

    def _check_size(self, params: GenerateParams) -> None:
        if params.messages is not None:
            n = sum(len(m.content.encode()) + len(m.role.encode()) for m in params.messages)
        else:
            n = len(params.prompt.encode()) if params.prompt is not None else 0
        if n > self.max_prompt_bytes:
            max_ctx = self.engine.program.max_seq_len
            raise RequestError(ErrorKind.INVALID_REQUEST, f"prompt is {n} bytes; at most {self.max_prompt_bytes} "
                               f"bytes can fit the context limit of {max_ctx} tokens (refused before tokenising)")

    def admit(self, params: GenerateParams) -> Request:
        """Validates, tokenises and prepares ``params``; returns the request to submit.

        Raises:
            RequestError: any rejection before queueing (kinds: ``InvalidRequest``, the constraint
                kinds from the sidecar, ``ConstraintServiceUnavailable``, ...).
        """
        params.validate()
        self._check_size(params)  # before any template rendering or tokenising (plain and tool/thinking turns)
        request_id = params.request_id or uuid.uuid4().hex
        planned = self.plan(params)
        prompt_ids, plan = planned if planned is not None else (self.encode(params), None)
        if not prompt_ids:
            raise RequestError(ErrorKind.INVALID_REQUEST, "the prompt is empty (0 tokens)")
        max_ctx = self.engine.program.max_seq_len
        if len(prompt_ids) >= max_ctx - 1:
            raise RequestError(ErrorKind.INVALID_REQUEST, f"prompt has {len(prompt_ids)} tokens; the context limit "
                               f"is {max_ctx} (at least 1 must remain for output)")
        method, k = self._speculation(params)
        c = params.constraint
        constraint = None if c is None else ConstraintRef(c.kind, source=c.source, choices=c.choices)
        if plan is not None and plan.wrapped:  # thinking stage / tool calls around (or instead of) the body
            constraint = constraint or ConstraintRef(None)
            constraint.wrapper = plan.grammar_key()
        req = Request(request_id=request_id, prompt_ids=prompt_ids,
                      max_tokens=params.max_tokens or self.default_max_tokens,
                      sampling=self._sampling(params, request_id), constraint=constraint, spec_method=method,
                      num_draft_tokens=k if method != SpecMethod.NONE else 0)
        if plan is not None:
            req.output = self.chat_output.new_stream(plan)
        if constraint is not None:
            self._prepare(req, params)
        return req

    def _speculation(self, params: GenerateParams) -> tuple[SpecMethod, int]:
        eng = self.engine
        method = SpecMethod(params.spec_method if params.spec_method is not None else eng.spec_method)
        k = params.num_draft_tokens or eng.num_draft_tokens
        if method != SpecMethod.NONE and k > eng.num_draft_tokens:
            raise RequestError(ErrorKind.INVALID_REQUEST, f"num_draft_tokens {k} exceeds the server's maximum "
                               f"{eng.num_draft_tokens} (start the server with --num-draft-tokens)")
        if method != SpecMethod.NONE and eng.num_draft_tokens == 0:
            raise RequestError(ErrorKind.INVALID_REQUEST, "speculative decoding is not enabled on this server "
                               "(start it with --num-draft-tokens K)")
        return method, k

    @staticmethod
    def _sampling(params: GenerateParams, request_id: str) -> SamplingOptions:
        temp, top_p, min_p, top_k = params.sampling_values()
        if params.seed is not None:
            seed = params.seed - (1 << 64) if params.seed >= (1 << 63) else params.seed  # uint64 -> int64, bijective
        else:
            seed = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little") & ((1 << 63) - 1)
        return SamplingOptions(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                               presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty)

    def _prepare(self, req: Request, params: GenerateParams) -> None:
        sc = self.engine.sidecar
        if sc is None:
            raise RequestError(ErrorKind.CONSTRAINT_SERVICE_UNAVAILABLE, "this server runs without a constraint "
                               "sidecar", status=Status.FAILED_PRECONDITION)
        prefix = b""
        if params.messages is not None and params.continue_final_message:
            prefix = params.messages[-1].content.encode()
        c = req.constraint
        c.prefix = prefix
        info = sc.prepare(req.request_id, "" if c.kind is None else str(c.kind), c.source, list(c.choices), prefix,
                          wrapper=c.wrapper)
        req.sidecar_generation = info.generation
        req.constraint_info = {"cache": info.cache, "prepare_seconds": info.prepare_seconds}
