"""ninfer_common.grpc_status: the rich-error status both servers answer with."""
from __future__ import annotations

import pickle

import grpc
import pytest
from google.rpc import status_pb2

from ninfer.constraint.v1 import constraint_pb2
from ninfer.v1.generation_pb2 import ErrorDetail
from ninfer_common.errors import ErrorKind, RequestError, RowError, Status
from ninfer_common.grpc_status import DETAILS_KEY, grpc_code, make_rpc_status, rpc_status_of, status_of_code


def test_make_rpc_status_shape():
    st = make_rpc_status(grpc.StatusCode.INVALID_ARGUMENT, ErrorDetail(kind="InvalidRegex", message="m", location="1:2"))
    assert st.code == grpc.StatusCode.INVALID_ARGUMENT and st.details == "m"
    (key, value), = st.trailing_metadata
    assert key == DETAILS_KEY
    from google.rpc import status_pb2

    rich = status_pb2.Status.FromString(value)
    d = ErrorDetail()
    assert rich.details[0].Unpack(d)
    assert (d.code, d.kind, d.location) == ("INVALID_ARGUMENT", "InvalidRegex", "1:2")
    with pytest.raises(ValueError):
        make_rpc_status(grpc.StatusCode.OK, ErrorDetail())


def test_rpc_status_of_maps_kind_status_and_location():
    err = RequestError("InvalidSchema", "expected an object, got 3", "/properties/a")
    st = rpc_status_of(err, ErrorDetail)
    assert st.code == grpc.StatusCode.INVALID_ARGUMENT
    rich = status_pb2.Status.FromString(dict(st.trailing_metadata)[DETAILS_KEY])
    d = ErrorDetail()
    assert rich.details[0].Unpack(d)
    assert (d.code, d.kind, d.message, d.location) == ("INVALID_ARGUMENT", "InvalidSchema", "expected an object, got 3",
                                                       "/properties/a")


def test_sidecar_detail_type_has_no_code_field():
    st = rpc_status_of(RequestError(ErrorKind.INVALID_REGEX, "m", "1:3"), constraint_pb2.ConstraintErrorDetail)
    rich = status_pb2.Status.FromString(dict(st.trailing_metadata)[DETAILS_KEY])
    d = constraint_pb2.ConstraintErrorDetail()
    assert rich.details[0].Unpack(d) and (d.kind, d.location) == ("InvalidRegex", "1:3")
    assert not rich.details[0].Is(ErrorDetail.DESCRIPTOR)


def test_status_round_trip_and_overrides():
    for s in Status:
        assert status_of_code(grpc_code(s)) is s
    assert status_of_code(grpc.StatusCode.UNIMPLEMENTED) is Status.INTERNAL
    assert RowError("ConstraintDeadEnd", "x", status=Status.FAILED_PRECONDITION).status is Status.FAILED_PRECONDITION
    assert RequestError("ConstraintDeadEnd", "x").status is Status.INVALID_ARGUMENT
    assert RequestError("ConstraintServiceUnavailable", "x").status is Status.UNAVAILABLE


def test_error_kind_is_its_wire_string_and_unknown_kinds_fail():
    e = RequestError("InvalidGrammar", "expected '::='", "1:7")
    assert e.kind is ErrorKind.INVALID_GRAMMAR and e.kind == "InvalidGrammar"
    assert str(e) == "InvalidGrammar at 1:7: expected '::='"
    assert e.to_dict() == {"code": "INVALID_ARGUMENT", "kind": "InvalidGrammar", "message": "expected '::='",
                           "location": "1:7"}
    with pytest.raises(ValueError):
        RequestError("NoSuchKind", "m")


def test_errors_survive_pickling():
    e = pickle.loads(pickle.dumps(RowError("IntegrityError", "token 5 rejected", status=Status.INTERNAL)))
    assert type(e) is RowError and (e.kind, e.message, e.status) == (ErrorKind.INTEGRITY_ERROR, "token 5 rejected",
                                                                     Status.INTERNAL)
