"""A child's readiness is one typed message on its channel, whichever
starter ran it: what it prints goes to its log, and a child that exits
first or stays silent is reported so, never taken for ready."""

from __future__ import annotations

import pytest

from shardsink.process import (
    MODULE,
    Child,
    Launch,
    NotReady,
    Ready,
    SpawnStarter,
    Zygote,
    resolve,
    run_role,
    wait_ready,
)
from shardsink.process.consensus import ROLE, decode_ready
from shardsink.protocol import CHILD_ROLES
from tests.helpers.roles import EXIT, ROLES, SLEEP, TELL


@pytest.fixture(params=["fork", "spawn"])
def starter(request, tmp_path):
    if request.param == "spawn":
        yield SpawnStarter()
        return
    zygote = Zygote(ROLES, tmp_path, timeout_s=10).start()
    yield zygote
    zygote.stop()


def test_the_message_is_read_and_what_it_prints_goes_to_its_log(starter, tmp_path) -> None:
    launch = Launch("server", "t", TELL, b"ipc:///x", stdout="pipe")
    child = Child(launch, starter, tmp_path).start()
    try:
        assert wait_ready(child, decode_ready, 60) == Ready(address="ipc:///x")
        assert "listening on nothing" in child.log_tail()
    finally:
        child.kill()


def test_a_child_that_exits_first_is_not_ready(starter, tmp_path) -> None:
    child = Child(Launch("server", "e", EXIT, b"3", stdout="pipe"), starter, tmp_path).start()
    with pytest.raises(NotReady, match="exited with status 3 before it was ready"):
        wait_ready(child, decode_ready, 60)


def test_a_silent_child_is_not_ready_within_the_timeout(starter, tmp_path) -> None:
    child = Child(Launch("server", "s", SLEEP, stdout="pipe"), starter, tmp_path).start()
    try:
        with pytest.raises(NotReady, match=r"not ready within 0\.2 s"):
            wait_ready(child, decode_ready, 0.2)
    finally:
        child.kill()


def test_every_role_shardsink_starts_names_a_main() -> None:
    for role in (*CHILD_ROLES, ROLE, MODULE):
        assert callable(resolve(role)), role


def test_a_role_that_names_nothing_exits_2_naming_it(capsys) -> None:
    assert run_role("no colon", b"") == 2
    assert run_role("shardsink.process.roles:missing", b"") == 2
    err = capsys.readouterr().err
    assert "unknown role 'no colon'" in err and "'shardsink.process.roles:missing'" in err
