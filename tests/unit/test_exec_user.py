"""`user=` of exec and process.exec (gh-16): the wire form and the unknown-user wording."""

from __future__ import annotations

import pytest

from rollbox import errors
from rollbox.server.execfiles import check_user, user_message

WANT = "unable to find user bob: no matching entries in passwd file"


def test_both_agents_unknown_user_messages_read_the_inspect_ai_way() -> None:
    assert user_message("user 'bob' is not in the image's /etc/passwd") == WANT  # the native agent
    assert user_message("user bob is not in the image's /etc/passwd") == WANT
    assert user_message(WANT) == WANT  # agent.py already says it so
    assert user_message("command not found: x") == "command not found: x"


@pytest.mark.parametrize("user,wire", [("nobody", "nobody"), (65534, "65534"), ("app:staff", "app:staff"), (0, "0")])
def test_user_is_a_name_or_a_uid(user: str | int, wire: str) -> None:
    assert check_user(user) == wire


@pytest.mark.parametrize("user", [True, -1, "", "a\nb", 1.5, ["root"]])
def test_a_bad_user_is_invalid_argument(user: object) -> None:
    with pytest.raises(errors.InvalidArgument):
        check_user(user)  # type: ignore[arg-type]
