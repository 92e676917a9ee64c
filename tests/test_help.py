"""Help texts show every default: each option of ``consensus serve``,
``chaos``, ``read``, ``export`` and every ``shard`` command that takes a
value says what it is when not given."""

from __future__ import annotations

import argparse
import re

import pytest

from shardsink.cli import build_parser, main

COMMANDS = [
    ("consensus", "serve"),
    ("chaos",),
    ("read",),
    ("export",),
    *(("shard", name) for name in ("inspect", "manifest", "history", "compact", "gc")),
    ("up",),
    ("bench", "cluster"),
]
#: Switches and the like: what they do when not given is plain.
NO_VALUE = (
    argparse._HelpAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
)


def _parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_shows_every_default(path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps at spaces and hyphens
    valued = [
        a
        for a in _parser(path)._actions
        if a.option_strings
        and not a.required
        and not isinstance(a, NO_VALUE)
        and a.help != argparse.SUPPRESS  # a former spelling, not shown
    ]
    assert valued
    for action in valued:
        assert re.search(r"\bdefault\b", action.help), (
            f"{action.option_strings[0]}: {action.help!r}"
        )
        assert "".join(action.help.split()) in shown, action.option_strings[0]


def test_serve_help_shows_the_values() -> None:
    shown = " ".join(_parser(("consensus", "serve")).format_help().split())
    for option, default in [
        ("--gc-interval-s S", "(default 60)"),
        ("--sweep-interval-s S", "(default 600)"),
        ("--rollup-threshold N", "(default 128)"),
        ("--max-attempts N", "(default 64)"),
        ("--data-dir D", "(default $SHARDSINK_DATA_DIR, else none)"),
    ]:
        after = shown.split(option + " ", 1)[1]
        assert default in after.split(" --", 1)[0], option
