"""What cannot emulate hosts says so in one line, naming what to install;
none of these needs root."""

from __future__ import annotations

import os
import sys

import pytest

from shardsink.netns import MissingCapability, Network, tools
from tests.netns.probes import hosts_command


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(MissingCapability) as exc:
        Network(2)
    assert "need root" in _one_line(exc) and "uid 1000" in _one_line(exc)


def test_no_ip(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingCapability) as exc:
        Network(2)
    assert "`ip` not found" in _one_line(exc) and "iproute2" in _one_line(exc)


def test_no_iptables(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingCapability) as exc:
        tools.require_iptables()
    assert "`iptables` not found" in _one_line(exc) and "Debian's iptables" in _one_line(exc)


def test_no_libfaketime(monkeypatch):
    monkeypatch.setattr(tools, "LIBFAKETIME_IN_PACKAGE", "not/here/libfaketime.so.1")
    with pytest.raises(MissingCapability) as exc:
        tools.libfaketime()
    assert "pip install libfaketime" in _one_line(exc)


def test_no_netfilterqueue(monkeypatch):
    monkeypatch.setitem(sys.modules, "netfilterqueue", None)  # find_spec: not importable
    with pytest.raises(MissingCapability) as exc:
        tools.require_netfilterqueue()
    assert "pip install NetfilterQueue" in _one_line(exc)
    assert "libnetfilter-queue-dev" in _one_line(exc)


def test_the_sweep_command_says_it_needs_root_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert hosts_command(["hosts", "sweep"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "shardsink hosts sweep: error: emulated hosts need root"
    )
