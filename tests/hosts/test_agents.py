"""Host agents: one host's processes started, watched, killed and reaped by
its agent, in this process and as Ray actors pinned to the nodes of a real
Ray cluster on loopback; a node removed without grace leaves none of them."""

from __future__ import annotations

import os
import uuid

import pytest

from shardsink.hosts.agent import (
    Done,
    HostAgent,
    Kill,
    Locate,
    Located,
    Poll,
    Polled,
    Refused,
    StartChild,
    Started,
    Tail,
    Text,
    decode_reply,
    encode,
)
from shardsink.process import Launch
from tests.helpers.cli import ROOT
from tests.helpers.cluster import wait_gone
from tests.helpers.roles import EXIT, ROLES, SLEEP
from tests.helpers.wait import wait_until

ENV = {"PYTHONPATH": str(ROOT)}


def _sleeper(name: str, seconds: str = "60") -> Launch:
    return Launch("worker", name, SLEEP, payload=seconds.encode(), env=ENV)


def _ask(agent: HostAgent, request):
    return decode_reply(agent.handle(encode(request)))


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_an_agent_starts_watches_and_kills_its_hosts_children(start):
    agent = HostAgent(f"t{uuid.uuid4().hex[:8]}", ROLES, start)
    try:
        leader = _ask(agent, StartChild(_sleeper("g0/b")))
        member = _ask(agent, StartChild(_sleeper("g0/w0"), leader="g0/b"))
        quick = _ask(agent, StartChild(Launch("worker", "g0/w1", EXIT, b"3", env=ENV), "g0/b"))
        assert isinstance(leader, Started) and isinstance(member, Started)
        assert isinstance(quick, Started)
        assert os.getpgid(member.pid) == leader.pid  # the group's leader leads its OS group

        def some_exited() -> list:
            polled = _ask(agent, Poll())
            assert isinstance(polled, Polled)
            return list(polled.exited)

        exited = wait_until(some_exited, 30, "an exit reported by the agent's Poll")
        assert [(e.name, e.pid, e.returncode) for e in exited] == [("g0/w1", quick.pid, 3)]
        assert _ask(agent, Poll()) == Polled(())  # each exit is reported once
        assert _ask(agent, Kill(("g0/w0",))) == Done()
        assert [e.name for e in _ask(agent, Poll()).exited] == ["g0/w0"]
        assert isinstance(_ask(agent, Tail("g0/w1")), Text)  # its log, empty or not
        located = _ask(agent, Locate())
        assert isinstance(located, Located) and located.where.run_dir == str(agent.run_dir)
    finally:
        agent.close()
        agent.close()
    wait_gone([leader.pid, member.pid], 10)
    assert not agent.run_dir.exists()


def test_an_agent_refuses_what_it_cannot_do_in_one_line():
    agent = HostAgent(f"t{uuid.uuid4().hex[:8]}", ROLES, "spawn")
    try:
        assert isinstance(decode_reply(agent.handle(b"\x93garbage")), Refused)
        unknown_leader = _ask(agent, StartChild(_sleeper("g0/w0"), leader="g0/b"))
        assert isinstance(unknown_leader, Refused) and "no child 'g0/b'" in unknown_leader.reason
        unknown = _ask(agent, Kill(("g9/b",)))
        assert isinstance(unknown, Refused) and "g9/b" in unknown.reason
        no_log = _ask(agent, Tail("g9/w0"))
        assert isinstance(no_log, Refused) and "g9/w0" in no_log.reason
    finally:
        agent.close()
    assert isinstance(_ask(agent, Poll()), Refused)  # closed
