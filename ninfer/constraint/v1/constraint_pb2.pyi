from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_STATUS_UNSPECIFIED: _ClassVar[CacheStatus]
    CACHE_STATUS_HIT: _ClassVar[CacheStatus]
    CACHE_STATUS_BUILT: _ClassVar[CacheStatus]
    CACHE_STATUS_WAITED: _ClassVar[CacheStatus]

class RowStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROW_STATUS_UNSPECIFIED: _ClassVar[RowStatus]
    ROW_STATUS_OK: _ClassVar[RowStatus]
    ROW_STATUS_INTEGRITY_ERROR: _ClassVar[RowStatus]
CACHE_STATUS_UNSPECIFIED: CacheStatus
CACHE_STATUS_HIT: CacheStatus
CACHE_STATUS_BUILT: CacheStatus
CACHE_STATUS_WAITED: CacheStatus
ROW_STATUS_UNSPECIFIED: RowStatus
ROW_STATUS_OK: RowStatus
ROW_STATUS_INTEGRITY_ERROR: RowStatus

class ConstraintErrorDetail(_message.Message):
    __slots__ = ("kind", "message", "location")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    location: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., location: _Optional[str] = ...) -> None: ...

class RegisterVocabularyRequest(_message.Message):
    __slots__ = ("vocab_size", "token_bytes", "special_ids", "eos_ids")
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_IDS_FIELD_NUMBER: _ClassVar[int]
    EOS_IDS_FIELD_NUMBER: _ClassVar[int]
    vocab_size: int
    token_bytes: _containers.RepeatedScalarFieldContainer[bytes]
    special_ids: _containers.RepeatedScalarFieldContainer[int]
    eos_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, vocab_size: _Optional[int] = ..., token_bytes: _Optional[_Iterable[bytes]] = ..., special_ids: _Optional[_Iterable[int]] = ..., eos_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RegisterVocabularyResponse(_message.Message):
    __slots__ = ("vocab_id",)
    VOCAB_ID_FIELD_NUMBER: _ClassVar[int]
    vocab_id: str
    def __init__(self, vocab_id: _Optional[str] = ...) -> None: ...

class AttachRingRequest(_message.Message):
    __slots__ = ("name", "byte_size", "num_slots", "num_lanes", "num_positions", "num_words")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_LANES_FIELD_NUMBER: _ClassVar[int]
    NUM_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_WORDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    byte_size: int
    num_slots: int
    num_lanes: int
    num_positions: int
    num_words: int
    def __init__(self, name: _Optional[str] = ..., byte_size: _Optional[int] = ..., num_slots: _Optional[int] = ..., num_lanes: _Optional[int] = ..., num_positions: _Optional[int] = ..., num_words: _Optional[int] = ...) -> None: ...

class AttachRingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("kind", "source", "choices", "wrapper")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    WRAPPER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    source: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    wrapper: str
    def __init__(self, kind: _Optional[str] = ..., source: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., wrapper: _Optional[str] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("request_id", "constraint", "prefix")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    constraint: Constraint
    prefix: bytes
    def __init__(self, request_id: _Optional[str] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., prefix: _Optional[bytes] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ("cache", "prepare_seconds", "complete")
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PREPARE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    cache: CacheStatus
    prepare_seconds: float
    complete: bool
    def __init__(self, cache: _Optional[_Union[CacheStatus, str]] = ..., prepare_seconds: _Optional[float] = ..., complete: _Optional[bool] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("request_id", "final_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    final_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., final_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("complete", "terminated", "mask_positions", "error")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    MASK_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    terminated: bool
    mask_positions: int
    error: str
    def __init__(self, complete: _Optional[bool] = ..., terminated: _Optional[bool] = ..., mask_positions: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class RowStep(_message.Message):
    __slots__ = ("request_id", "row", "commit_tokens", "draft_tokens", "close")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    row: int
    commit_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    close: bool
    def __init__(self, request_id: _Optional[str] = ..., row: _Optional[int] = ..., commit_tokens: _Optional[_Iterable[int]] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., close: _Optional[bool] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("step_seq", "slot", "rows")
    STEP_SEQ_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    step_seq: int
    slot: int
    rows: _containers.RepeatedCompositeFieldContainer[RowStep]
    def __init__(self, step_seq: _Optional[int] = ..., slot: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[RowStep, _Mapping]]] = ...) -> None: ...

class RowResult(_message.Message):
    __slots__ = ("request_id", "row", "status", "complete", "terminated", "error", "mask_positions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MASK_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    row: int
    status: RowStatus
    complete: bool
    terminated: bool
    error: str
    mask_positions: int
    def __init__(self, request_id: _Optional[str] = ..., row: _Optional[int] = ..., status: _Optional[_Union[RowStatus, str]] = ..., complete: _Optional[bool] = ..., terminated: _Optional[bool] = ..., error: _Optional[str] = ..., mask_positions: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("step_seq", "slot", "rows", "work_seconds")
    STEP_SEQ_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WORK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    step_seq: int
    slot: int
    rows: _containers.RepeatedCompositeFieldContainer[RowResult]
    work_seconds: float
    def __init__(self, step_seq: _Optional[int] = ..., slot: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[RowResult, _Mapping]]] = ..., work_seconds: _Optional[float] = ...) -> None: ...
