from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]

class ToolConstraintMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CONSTRAINT_MODE_UNSPECIFIED: _ClassVar[ToolConstraintMode]
    TOOL_CONSTRAINT_MODE_BASIC: _ClassVar[ToolConstraintMode]
    TOOL_CONSTRAINT_MODE_AUTOMATIC: _ClassVar[ToolConstraintMode]

class Channel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL_UNSPECIFIED: _ClassVar[Channel]
    CHANNEL_CONTENT: _ClassVar[Channel]
    CHANNEL_REASONING: _ClassVar[Channel]
    CHANNEL_TOOL_CALL: _ClassVar[Channel]

class SpeculativeMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATIVE_METHOD_UNSPECIFIED: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_NONE: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_NGRAM: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_EARLY_EXIT: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED: _ClassVar[SpeculativeMethod]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]

class CacheStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_STATUS_UNSPECIFIED: _ClassVar[CacheStatus]
    CACHE_STATUS_HIT: _ClassVar[CacheStatus]
    CACHE_STATUS_BUILT: _ClassVar[CacheStatus]
    CACHE_STATUS_WAITED: _ClassVar[CacheStatus]
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CONSTRAINT_MODE_UNSPECIFIED: ToolConstraintMode
TOOL_CONSTRAINT_MODE_BASIC: ToolConstraintMode
TOOL_CONSTRAINT_MODE_AUTOMATIC: ToolConstraintMode
CHANNEL_UNSPECIFIED: Channel
CHANNEL_CONTENT: Channel
CHANNEL_REASONING: Channel
CHANNEL_TOOL_CALL: Channel
SPECULATIVE_METHOD_UNSPECIFIED: SpeculativeMethod
SPECULATIVE_METHOD_NONE: SpeculativeMethod
SPECULATIVE_METHOD_NGRAM: SpeculativeMethod
SPECULATIVE_METHOD_EARLY_EXIT: SpeculativeMethod
SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED: SpeculativeMethod
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
CACHE_STATUS_UNSPECIFIED: CacheStatus
CACHE_STATUS_HIT: CacheStatus
CACHE_STATUS_BUILT: CacheStatus
CACHE_STATUS_WAITED: CacheStatus

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    reasoning: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., reasoning: _Optional[str] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "allowed_names", "parallel", "constraints")
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_NAMES_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    allowed_names: _containers.RepeatedScalarFieldContainer[str]
    parallel: bool
    constraints: ToolConstraintMode
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., allowed_names: _Optional[_Iterable[str]] = ..., parallel: _Optional[bool] = ..., constraints: _Optional[_Union[ToolConstraintMode, str]] = ...) -> None: ...

class ThinkingOptions(_message.Message):
    __slots__ = ("enabled", "budget_tokens")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    budget_tokens: int
    def __init__(self, enabled: _Optional[bool] = ..., budget_tokens: _Optional[int] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("messages", "continue_final_message")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    continue_final_message: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., continue_final_message: _Optional[bool] = ...) -> None: ...

class JsonObject(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Choice(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class OutputConstraint(_message.Message):
    __slots__ = ("json_object", "json_schema", "grammar", "regex", "choice")
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    json_object: JsonObject
    json_schema: str
    grammar: str
    regex: str
    choice: Choice
    def __init__(self, json_object: _Optional[_Union[JsonObject, _Mapping]] = ..., json_schema: _Optional[str] = ..., grammar: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choice, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "seed", "presence_penalty", "frequency_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    presence_penalty: float
    frequency_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ...) -> None: ...

class SpeculativeOptions(_message.Message):
    __slots__ = ("method", "num_draft_tokens")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    method: SpeculativeMethod
    num_draft_tokens: int
    def __init__(self, method: _Optional[_Union[SpeculativeMethod, str]] = ..., num_draft_tokens: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "chat", "max_tokens", "sampling", "constraint", "speculative", "tools", "tool_choice", "thinking")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    THINKING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    chat: Chat
    max_tokens: int
    sampling: SamplingParams
    constraint: OutputConstraint
    speculative: SpeculativeOptions
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    thinking: ThinkingOptions
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., constraint: _Optional[_Union[OutputConstraint, _Mapping]] = ..., speculative: _Optional[_Union[SpeculativeOptions, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., thinking: _Optional[_Union[ThinkingOptions, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "draft_tokens", "accepted_draft_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class ConstraintResult(_message.Message):
    __slots__ = ("kind", "complete", "terminated", "cache", "prepare_seconds", "mask_positions", "branch")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PREPARE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MASK_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    complete: bool
    terminated: bool
    cache: CacheStatus
    prepare_seconds: float
    mask_positions: int
    branch: str
    def __init__(self, kind: _Optional[str] = ..., complete: _Optional[bool] = ..., terminated: _Optional[bool] = ..., cache: _Optional[_Union[CacheStatus, str]] = ..., prepare_seconds: _Optional[float] = ..., mask_positions: _Optional[int] = ..., branch: _Optional[str] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "kind", "message", "location")
    CODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    code: str
    kind: str
    message: str
    location: str
    def __init__(self, code: _Optional[str] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., location: _Optional[str] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("finish_reason", "usage", "constraint", "error", "tool_calls", "reasoning")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    usage: Usage
    constraint: ConstraintResult
    error: ErrorDetail
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    reasoning: str
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., constraint: _Optional[_Union[ConstraintResult, _Mapping]] = ..., error: _Optional[_Union[ErrorDetail, _Mapping]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish", "channel", "tool_call_index", "tool_call")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish: Finish
    channel: Channel
    tool_call_index: int
    tool_call: ToolCall
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish: _Optional[_Union[Finish, _Mapping]] = ..., channel: _Optional[_Union[Channel, str]] = ..., tool_call_index: _Optional[int] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ...) -> None: ...

class CountTokensRequest(_message.Message):
    __slots__ = ("prompt", "chat")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    chat: Chat
    def __init__(self, prompt: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ...) -> None: ...

class CountTokensResponse(_message.Message):
    __slots__ = ("num_tokens", "max_context_tokens")
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_tokens: int
    max_context_tokens: int
    def __init__(self, num_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ...) -> None: ...
