"""Flags, environment and TOML from a config Struct: one layering toolkit.

A command's settings are the fields of one frozen msgspec Struct (a config).
:func:`add_options` gives a parser ``--config FILE.toml`` and one flag per
field: field ``foo_bar`` is flag ``--foo-bar`` and TOML key ``foo_bar``; its
type and the default shown come from the Struct, its metavar and help from
the command's table of :class:`Flag` rows. :func:`layered` then takes each
field from its flag if given, else its environment variable, else the file,
else the default, and :func:`build` makes the Struct, refusing a bad key by
name. :class:`Parser` answers an unknown flag with the nearest valid ones.

Beside the floors: imports only the standard library, msgspec and
:mod:`._units`, so a config of any floor can use it.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Literal,
    NamedTuple,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints as _hints,
)

import msgspec

from ._units import format_size, parse_size

T = TypeVar("T", bound=msgspec.Struct)


class _Bytes:
    """The mark of a config field that holds a byte count (``Annotated[int, BYTES]``):
    its flag and a TOML string may write it with a unit (``1MiB``)."""

    def __repr__(self) -> str:
        return "BYTES"


BYTES = _Bytes()
#: A config field holding a byte count.
Size = Annotated[int, BYTES]


class Flag(NamedTuple):
    """How one config field is given on the command line: the flag is the
    field's name with dashes; ``help`` is followed by ``(default ...)``, the
    Struct's value unless ``default`` words it. ``old`` is a former spelling,
    never shown, refused as a flag and (its dashes underscores) as a TOML key
    with the name the setting has now; ``const``, if set, is what the flag given
    without a value means (``--dashboard`` alone)."""

    metavar: str | None
    help: str
    default: str | None = None
    old: str | None = None
    const: Any = None


def flag_of(field: str) -> str:
    """The flag of config field ``field``: ``foo_bar`` is ``--foo-bar``."""
    return "--" + field.replace("_", "-")


def add_options(
    parser: argparse.ArgumentParser, kind: type, flags: Mapping[str, Flag], example: str
) -> None:
    """``--config FILE.toml`` (``kind``'s fields as TOML keys, ``example``
    shows some) and a flag for every field of ``kind`` but those holding a
    Struct (TOML tables only), each described by its row of ``flags``.

    Every option added to ``parser`` after it defaults to ``SUPPRESS``, so
    that only flags given override the file (:func:`layered`); each such
    option's dest must be the field it sets.
    """
    missing = [f for f in _flaggable(kind) if f not in flags]
    if missing:
        raise ValueError(f"{kind.__name__} fields without a flag: {', '.join(missing)}")
    parser.argument_default = argparse.SUPPRESS
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE.toml",
        help=f"{kind.__name__} fields as TOML keys ({example}, ...); flags given override it; "
        "an unknown key or a bad value is refused (default: none)",
    )
    add_fields(parser, kind, flags)


def add_fields(
    parser: argparse.ArgumentParser,
    kind: type,
    flags: Mapping[str, Flag],
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """A flag for each field of ``kind`` that ``flags`` has a row for, in the
    Struct's order. Without ``defaults`` a flag not given sets nothing (the
    parser's ``argument_default``) and shows the Struct's default; with them,
    a flag not given sets its field's value of ``defaults`` (else the
    Struct's default), which it shows."""
    unknown = sorted(set(flags) - set(kind.__struct_fields__))
    if unknown:
        raise ValueError(f"{kind.__name__} has no fields {', '.join(unknown)}")
    instance = kind()
    for field in msgspec.structs.fields(kind):
        row = flags.get(field.name)
        if row is None:
            continue
        value = (defaults or {}).get(field.name, getattr(instance, field.name))
        shown = row.default or _shown(value, field.type)
        kwargs: dict[str, Any] = {"dest": field.name}
        if defaults is not None:
            kwargs["default"] = value
        if _scalar(field.type) is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=_converter(field.type), metavar=row.metavar or _choices(field.type))
            if row.const is not None:
                kwargs.update(nargs="?", const=row.const)
        parser.add_argument(flag_of(field.name), help=f"{row.help} (default {shown})", **kwargs)
        if row.old is not None:
            _RENAMED.setdefault(kind, {})[row.old.lstrip("-").replace("-", "_")] = field.name
            parser.add_argument(
                row.old,
                help=argparse.SUPPRESS,
                action=_Renamed,
                nargs="?",
                dest=f"_renamed_{field.name}",
                new=flag_of(field.name),
            )


#: By config Struct, each former name of a field (a :class:`Flag`'s ``old``
#: as a TOML key) and the field's name: filled as the flags are added, so a
#: command's TOML keys are answered as its flags are.
_RENAMED: dict[type, dict[str, str]] = {}


class _Renamed(argparse.Action):
    """A former spelling of a flag: refused, naming the flag the setting has
    now (one name per setting, the same in flags, TOML and the API)."""

    def __init__(self, option_strings, dest, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(
            f"{option_string} is now {self.new}: a setting has one name, its field's, "
            f"as flag ({self.new}), TOML key and keyword ({self.new[2:].replace('-', '_')})"
        )


def _flaggable(kind: type) -> list[str]:
    """``kind``'s fields but those that hold a Struct or a dict (TOML tables only)."""
    return [
        f.name
        for f in msgspec.structs.fields(kind)
        if _struct(f.type) is None and get_origin(_unwrap(f.type)) is not dict
    ]


def _shown(value: Any, kind: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and _is_size(kind):
        return format_size(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _is_size(kind: Any) -> bool:
    return get_origin(kind) is Annotated and BYTES in kind.__metadata__


def _choices(kind: Any) -> str | None:
    """``a|b|c`` for a field typed ``Literal["a", "b", "c"]``."""
    kind = _unwrap(kind)
    return "|".join(map(str, get_args(kind))) if get_origin(kind) is Literal else None


def _unwrap(kind: Any) -> Any:
    """``kind`` without ``Annotated`` and without ``| None``."""
    if get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return kind


def _scalar(kind: Any) -> Any:
    """What a flag of a field typed ``kind`` reads a value as: a ``Literal``'s
    values' type, a union's first member's."""
    kind = _unwrap(kind)
    args = [a for a in get_args(kind) if a is not type(None)]
    if get_origin(kind) is Literal:
        return type(args[0])
    if get_origin(kind) in (Union, types.UnionType):
        return _scalar(args[0])
    return kind


def _converter(kind: Any):
    """The argparse ``type`` of a flag of a field typed ``kind``: a size reads
    units (and the words of a ``Literal`` beside it, ``auto``), a tuple is a
    comma-separated list."""
    if _is_size(kind):
        words = [
            w for a in get_args(_unwrap(kind)) if get_origin(a) is Literal for w in get_args(a)
        ]

        def size(text: str) -> int | str:
            if text in words:
                return text
            try:
                return parse_size(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(
                    f"{exc}" + "".join(f", or {w}" for w in words)
                ) from None

        return size
    if get_origin(_unwrap(kind)) is tuple:
        return lambda text: tuple(k.strip() for k in text.split(",") if k.strip())
    return _scalar(kind)


def _struct(kind: Any) -> type | None:
    """The Struct a field typed ``kind`` holds, if it holds one."""
    kind = _unwrap(kind)
    return kind if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else None


def load_toml(kind: type, path: str | os.PathLike) -> dict[str, Any]:
    """The table of a TOML file of ``kind``'s fields, sizes (:data:`Size`
    fields, at the top or in the table of a Struct field) written as text
    converted.

    Raises ``ValueError`` naming the file if it cannot be read or is not TOML, and
    the key and the file for a size that does not parse.
    """
    try:
        data = msgspec.toml.decode(Path(path).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise ValueError(f"cannot read config file {os.fspath(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {os.fspath(path)!r} is not a table")
    # a kind may read some tables its own way (ClusterConfig's [workload])
    data = getattr(kind, "from_toml", lambda table: table)(data)
    _parse_sizes(kind, data, os.fspath(path))
    return data


def _parse_sizes(kind: type, table: dict[str, Any], path: str, prefix: str = "") -> None:
    """Sizes written as text in ``table`` (of ``kind``) and its Structs' tables,
    converted in place."""
    fields = {f.name: f.type for f in msgspec.structs.fields(kind)}
    for name, value in table.items():
        field = fields.get(name)
        inner = _struct(field)
        if inner is not None and isinstance(value, dict):
            _parse_sizes(inner, value, path, f"{prefix}{name}.")
        elif _is_size(field) and isinstance(value, str):
            try:
                table[name] = _converter(field)(value)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"{prefix}{name} in {path!r}: {exc}") from None


def layered(
    kind: type[T],
    path: str | os.PathLike | None,
    given: dict[str, Any],
    environment: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The fields of a ``kind`` a command runs with, for :func:`build`.

    Each comes from ``given`` (the flags given, by field name; other names are
    ignored), else its environment variable (``environment`` maps variable to
    field), else the TOML file at ``path``, else ``kind``'s default (left out).
    The file alone must make a valid ``kind``: ``ValueError`` naming the file
    and the key otherwise.
    """
    fields: dict[str, Any] = {}
    if path is not None:
        fields = load_toml(kind, path)
        build(kind, fields, source=f"config file {os.fspath(path)!r}")
    for variable, name in (environment or {}).items():
        if os.environ.get(variable):
            fields[name] = os.environ[variable]
    fields.update({k: v for k, v in given.items() if k in kind.__struct_fields__})
    return fields


def build(kind: type[T], fields: dict[str, Any], *, source: str = "options") -> T:
    """``kind`` (a config Struct) from ``fields``, checked as strictly as a wire message.

    Raises ``ValueError`` naming ``source`` and the offending key: an unknown key
    (with the nearest valid ones), a value of the wrong type, or one its
    ``__post_init__`` refuses.
    """
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{source}: {_plain(kind, exc)}") from None


def _plain(kind: type, exc: msgspec.ValidationError) -> str:
    """msgspec's message with its ``$.field`` paths read as a person would write them;
    a value outside a ``Literal`` is answered with the choices, as ``__post_init__`` does,
    an unknown key with the nearest valid ones."""
    text = str(exc)
    enum = re.fullmatch(r"Invalid enum value (.+) - at `\$\.(\w+)`", text)
    if enum:
        choices = get_args(_hints(kind)[enum.group(2)])
        return f"unknown {enum.group(2)} {enum.group(1)}; choose one of {', '.join(choices)}"
    unknown = re.fullmatch(
        r"Object contains unknown field `([^`]+)`(?: - at `\$\.([\w.]+)`)?", text
    )
    if unknown:
        for name in filter(None, (unknown.group(2) or "").split(".")):
            kind = _struct(_hints(kind).get(name)) or kind
        renamed = _RENAMED.get(kind, {}).get(unknown.group(1))
        text += (
            f"; it is {renamed!r} now"
            if renamed
            else did_you_mean(unknown.group(1), kind.__struct_fields__, quote=True)
        )
    text = re.sub(r"Object contains unknown field `([^`]+)`", r"unknown key '\1'", text)
    return re.sub(r"\s*- at `\$\.([^`]+)`", r" (key '\1')", text)


def did_you_mean(name: str, valid, *, quote: bool = False) -> str:
    """``; did you mean X or Y?`` naming the valid names nearest ``name`` (those
    that contain it first, then the closest by :mod:`difflib`), or ``""``."""
    word = name.strip("-_")
    near = [n for n in valid if len(word) >= 3 and word in n]
    near += [n for n in difflib.get_close_matches(name, list(valid), n=3) if n not in near]
    near = near[:3]
    if not near:
        return ""
    return "; did you mean " + " or ".join(repr(n) if quote else n for n in near) + "?"


_LEAF = "_options_leaf_parser"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands' too) that names the nearest valid
    flags when one is unknown (``--group``: did you mean ``--groups``?) and
    takes no abbreviation of a flag for the flag: one name per setting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(namespace, _LEAF):  # the innermost subcommand's comes first
            setattr(namespace, _LEAF, self)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        leaf = vars(namespace).pop(_LEAF, self)
        if extras:
            leaf.error(f"unrecognized arguments: {' '.join(extras)}{leaf.nearest(extras)}")
        return namespace

    def nearest(self, extras: list[str]) -> str:
        """``; did you mean ...?`` for the first flag of ``extras`` near a shown one."""
        shown = [s for a in self._actions if a.help != argparse.SUPPRESS for s in a.option_strings]
        for extra in extras:
            if extra.startswith("-"):
                hint = did_you_mean(extra.split("=", 1)[0], shown)
                if hint:
                    return hint
        return ""
