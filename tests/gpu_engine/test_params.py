"""The transport-free request (core.params), its protobuf conversion (api.convert) and admission checks."""
from __future__ import annotations

import pytest

from gpu_engine.api.convert import finish_to_proto, params_from_proto
from gpu_engine.core.params import MAX_CHOICES, ChatMessage, ConstraintParams, GenerateParams
from gpu_engine.core.request import CacheStatus, ConstraintResult, Finish, FinishReason, SpecMethod
from ninfer.v1 import generation_pb2 as pb
from ninfer_common.constraint_kind import ConstraintKind
from ninfer_common.errors import ErrorKind, RequestError, RowError, Status


def _kind_of(params: GenerateParams) -> ErrorKind | None:
    try:
        params.validate()
    except RequestError as e:
        return e.kind
    return None


def test_validate_accepts_defaults_and_rejects_bad_values():
    assert _kind_of(GenerateParams(prompt="hi")) is None
    assert _kind_of(GenerateParams()) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(prompt="a", messages=[ChatMessage("user", "b")])) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(prompt="hi", temperature=float("nan"))) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(prompt="hi", top_p=0.0)) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(prompt="hi", min_p=1.5)) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(prompt="hi", top_k=-1)) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(prompt="hi", presence_penalty=2.5)) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(messages=[ChatMessage("robot", "x")])) is ErrorKind.INVALID_REQUEST
    assert _kind_of(GenerateParams(messages=[ChatMessage("user", "x")], continue_final_message=True)) \
        is ErrorKind.INVALID_REQUEST
    many = ConstraintParams(ConstraintKind.CHOICE, choices=tuple(str(i) for i in range(MAX_CHOICES + 1)))
    assert _kind_of(GenerateParams(prompt="hi", constraint=many)) is ErrorKind.INVALID_CHOICE
    big = ConstraintParams(ConstraintKind.REGEX, source="a" * ((1 << 20) + 1))
    assert _kind_of(GenerateParams(prompt="hi", constraint=big)) is ErrorKind.INVALID_REQUEST


def test_params_from_proto_maps_every_field():
    msg = pb.GenerateRequest(request_id="r1", max_tokens=9, chat=pb.Chat(
        messages=[pb.ChatMessage(role="user", content="hi")], continue_final_message=False))
    msg.sampling.temperature = 0.0
    msg.sampling.seed = (1 << 64) - 1
    msg.constraint.regex = "[a-z]+"
    msg.speculative.method = pb.SPECULATIVE_METHOD_EARLY_EXIT
    msg.speculative.num_draft_tokens = 3
    p = params_from_proto(msg)
    assert (p.request_id, p.max_tokens, p.prompt, p.messages) == ("r1", 9, None, [ChatMessage("user", "hi")])
    assert p.temperature == 0.0 and p.top_p is None and p.seed == (1 << 64) - 1
    assert p.constraint == ConstraintParams(ConstraintKind.REGEX, source="[a-z]+")
    assert p.spec_method is SpecMethod.EARLY_EXIT and p.num_draft_tokens == 3
    choice = pb.GenerateRequest(prompt="x")
    choice.constraint.choice.options.extend(["yes", "no"])
    assert params_from_proto(choice).constraint == ConstraintParams(ConstraintKind.CHOICE, choices=("yes", "no"))
    obj = pb.GenerateRequest(prompt="x")
    obj.constraint.json_object.SetInParent()
    assert params_from_proto(obj).constraint == ConstraintParams(ConstraintKind.JSON_OBJECT)


def test_params_from_proto_rejects_missing_input_and_empty_constraint():
    with pytest.raises(RequestError) as ei:
        params_from_proto(pb.GenerateRequest())
    assert ei.value.kind is ErrorKind.INVALID_REQUEST and ei.value.status is Status.INVALID_ARGUMENT
    msg = pb.GenerateRequest(prompt="x")
    msg.constraint.SetInParent()  # set, but no kind: must never be dropped silently
    with pytest.raises(RequestError, match="holds no constraint kind"):
        params_from_proto(msg)


def test_finish_to_proto_keeps_the_public_shape():
    ev = Finish(FinishReason.ERROR, prompt_tokens=4, completion_tokens=2, draft_tokens=3, accepted_draft_tokens=1,
                constraint=ConstraintResult(ConstraintKind.GRAMMAR, complete=False, terminated=False,
                                            cache=CacheStatus.HIT, prepare_seconds=0.5, mask_positions=7),
                error=RowError("ConstraintDeadEnd", "no token", status=Status.FAILED_PRECONDITION))
    f = finish_to_proto(ev)
    assert f.finish_reason == pb.FINISH_REASON_ERROR and f.usage.accepted_draft_tokens == 1
    assert (f.constraint.kind, f.constraint.cache, f.constraint.mask_positions) == ("grammar", pb.CACHE_STATUS_HIT, 7)
    assert (f.error.code, f.error.kind, f.error.message) == ("FAILED_PRECONDITION", "ConstraintDeadEnd", "no token")
    assert not finish_to_proto(Finish(FinishReason.STOP, 1, 1)).HasField("error")


def test_both_executors_implement_the_protocol():
    import inspect

    from gpu_engine.executor.base import Executor
    from gpu_engine.executor.cuda_graph import CudaProgram
    from gpu_engine.executor.eager import Program

    methods = [n for n, v in vars(Executor).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert set(methods) == {"forward", "stage_masks", "sample", "release_lane", "close"}
    for cls in (Program, CudaProgram):
        for name in methods:
            want = list(inspect.signature(getattr(Executor, name)).parameters)
            assert list(inspect.signature(getattr(cls, name)).parameters) == want, (cls, name)


@pytest.mark.parametrize("field,value", [("temperature", float("nan")), ("top_p", 0.0), ("min_p", 2.0), ("top_k", -3),
                                         ("presence_penalty", 3.0), ("frequency_penalty", float("inf"))])
def test_out_of_range_sampling_values_name_their_field(field, value):
    from ninfer_common.errors import RequestError

    p = GenerateParams(request_id="r", prompt="x", **{field: value})
    with pytest.raises(RequestError) as ei:
        p.validate()
    assert ei.value.kind.value == "InvalidRequest" and ei.value.location == f"/{field}", ei.value
