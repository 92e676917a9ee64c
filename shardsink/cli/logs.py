"""``shardsink logs [--follow] [PROCESS]``: the per-process logs a data dir keeps.

A cluster keeps each run's logs in ``DATA_DIR/logs/STAMP-CLUSTER/``
(:mod:`shardsink.process.logs`); this shows the newest run's (or ``--run``'s):
every process's last lines under a header naming it, or one process's log
(``g0/w1``, ``consensus``, ``zygote``, ...), and with ``--follow`` what they
write next, until the run has ended (or Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..process import logs

#: How often ``--follow`` looks for more.
FOLLOW_EVERY_S = 0.25
LINES = 20


def register(commands):
    """The ``logs`` parser (its ``--data-dir`` is added with ``status``'s and ``stop``'s)."""
    parser = commands.add_parser(
        "logs",
        help="show the per-process logs of a data dir's runs",
        description="Show the logs a cluster run on the data dir kept (DATA_DIR/logs/, the last "
        f"{logs.KEEP_RUNS} runs, each log rotated past {logs.MAX_BYTES >> 20} MiB): every "
        "process's last lines under a header naming it, or the whole log of PROCESS. Exit 1 "
        "if there is no such run or process.",
    )
    parser.add_argument(
        "process", nargs="?", metavar="PROCESS", help="one process: g0/w1, g0/b, consensus, ..."
    )
    parser.add_argument(
        "--run",
        metavar="RUN",
        help="a run by its directory name or cluster id, or -N: the Nth newest (default -1)",
        default="-1",
    )
    parser.add_argument("--list", action="store_true", help="list the kept runs and exit")
    parser.add_argument(
        "-n",
        "--lines",
        type=int,
        default=None,
        metavar="N",
        help=f"the last N lines of each log (default {LINES}; PROCESS alone: all of it)",
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then print what the logs get next, until the run has ended or Ctrl-C",
    )
    parser.set_defaults(func=_logs)
    return parser


def _logs(args: argparse.Namespace) -> int:
    keep = Path(args.data_dir) / logs.LOGS  # absolute: the command line made it so
    runs = logs.runs(keep)
    if not runs:
        return _fail(f"no logs kept in {keep}: no cluster ran on data dir {args.data_dir}")
    if args.list:
        for run in runs:
            state = "ended" if logs.ended(run) else "running or killed"
            names = ", ".join(p.name[: -len(logs.SUFFIX)] for p in _files(run))
            print(f"{run.name}  {state}  {names}")
        return 0
    run = _pick(runs, args.run)
    if run is None:
        names = ", ".join(r.name for r in runs)
        return _fail(f"no run {args.run!r} in {keep}; kept: {names} (or -1, -2, ...)")
    if args.process is None:
        files = _files(run)
    else:
        files = [run / logs.file_name(args.process.replace("-", "/"))]
        if not files[0].exists():
            known = ", ".join(p.name[: -len(logs.SUFFIX)].replace("-", "/") for p in _files(run))
            return _fail(f"no log of {args.process!r} in run {run.name}; its processes: {known}")
    lines = args.lines if args.lines is not None else (None if args.process else LINES)
    print(f"run {run.name} ({run})", file=sys.stderr)
    offsets = {}
    for path in files:
        data = path.read_bytes()
        offsets[path] = len(data)
        text = data.decode(errors="replace")
        if lines is not None:
            text = "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""
        if len(files) > 1:
            print(f"--- {_process(path)} ({path.name}) ---")
        sys.stdout.write(text or "(empty)\n")
    sys.stdout.flush()
    if args.follow:
        _follow(run, offsets, args.process is None)
    return 0


def _follow(run: Path, offsets: dict[Path, int], every_file: bool) -> None:
    """Print what the logs get past ``offsets`` (every log of ``run`` if
    ``every_file``, new ones too), each line prefixed with its process when
    there are several, until the run has ended."""
    while True:
        ended = logs.ended(run)  # before the last read: nothing written after it is lost
        if every_file:
            for path in _files(run):
                offsets.setdefault(path, 0)
        for path, offset in offsets.items():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < offset:  # rotated: it starts again from the beginning
                offset = 0
            if size == offset:
                continue
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            offsets[path] = offset + len(data)
            text = data.decode(errors="replace")
            if every_file:
                text = "".join(f"{_process(path)}| {line}" for line in text.splitlines(True))
            sys.stdout.write(text)
        sys.stdout.flush()
        if ended:
            return
        time.sleep(FOLLOW_EVERY_S)


def _pick(runs: list[Path], which: str) -> Path | None:
    if which.startswith("-") and which[1:].isdigit() and 0 < int(which[1:]) <= len(runs):
        return runs[int(which)]
    matches = [r for r in runs if r.name == which or r.name.endswith(f"-{which}")]
    return matches[-1] if matches else None


def _files(run: Path) -> list[Path]:
    return sorted(run.glob(f"*{logs.SUFFIX}"))


def _process(path: Path) -> str:
    """The process a log file is of (``g0-w1.log``: ``g0/w1``)."""
    return path.name[: -len(logs.SUFFIX)].replace("-", "/")


def _fail(message: str) -> int:
    print(f"shardsink logs: {message}", file=sys.stderr)
    return 1
