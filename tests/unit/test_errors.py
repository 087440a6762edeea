from __future__ import annotations

import pytest

from rollbox import errors
from rollbox.errors import CODES, ApiError, RollboxError, from_wire


@pytest.mark.parametrize("code,cls", sorted(CODES.items()))
def test_round_trip_every_code(code, cls):
    err = cls(f"boom {code}", sandbox_id="sb-123")
    wire = err.to_wire()
    assert wire == {"code": code, "message": f"boom {code}", "sandbox_id": "sb-123"}
    back = from_wire(wire, cls.status)
    assert type(back) is cls
    assert back.message == err.message
    assert str(back) == err.message
    assert back.sandbox_id == "sb-123"
    assert back.retryable == err.retryable
    assert back.status == cls.status


def test_round_trip_without_sandbox_id():
    back = from_wire(errors.SandboxNotFound("gone").to_wire(), 404)
    assert isinstance(back, errors.SandboxNotFound)
    assert back.sandbox_id is None


def test_codes_are_unique_and_complete():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, RollboxError)]
    assert set(classes) == set(CODES.values())
    assert len({c.code for c in classes}) == len(classes)


def test_unknown_code_becomes_api_error():
    back = from_wire({"code": "no_such_code", "message": "weird"}, 500)
    assert type(back) is ApiError
    assert back.message == "weird"


def test_missing_fields():
    back = from_wire({}, 502)
    assert type(back) is ApiError
    assert "502" in back.message


def test_hierarchy_and_retryable():
    assert issubclass(errors.SandboxNotFound, errors.NotFound)
    assert issubclass(errors.ImageNotFound, errors.NotFound)
    assert issubclass(errors.SandboxTerminated, errors.InvalidState)
    assert errors.SandboxNotFound.status == 404
    assert errors.SandboxTerminated.status == 409
    retryable = {c for c in CODES.values() if c.retryable}
    assert retryable == {errors.SandboxLost, errors.ResourceExhausted, errors.DaemonUnavailable, errors.ImagePullError}
