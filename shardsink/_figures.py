"""What every plot of a benchmark or a chaos run carries: a caption naming the command, the
commit and the machine it was measured with, and bars that show their
repeats.

A bar is the median of its repeats, its error bar their lowest and highest,
its value written on it; a measured zero is a bar labelled ``0``, a shape
not measured is labelled ``n/a``, so the two cannot be mistaken for each
other. Axes start at zero.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

#: Where the caption goes: the figure's bottom, this share of its height kept for it.
CAPTION_SPACE = 0.16


def command_line() -> str:
    """The command as the user typed it: ``shardsink`` and argv."""
    return " ".join(["shardsink", *sys.argv[1:]])


@cache
def commit() -> str:
    """The commit of the package's checkout (``+dirty`` if it has changes),
    or its version when it is not a git checkout."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short=10", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.TimeoutExpired):
        head = ""
    if not head:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"shardsink {version('shardsink')}"
        except PackageNotFoundError:
            return "shardsink (not installed, no git checkout)"
    return f"commit {head}{'+dirty' if dirty else ''}"


@cache
def machine() -> str:
    """The machine in a few words: cores, CPU model, system, Python."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}"
    )


def caption(command: str | None = None, note: str = "") -> str:
    """The caption of a plot measured by ``command`` (default: this one's)."""
    text = f"{command or command_line()} | {commit()} | {machine()}"
    return f"{note} | {text}" if note else text


def add_caption(fig, text: str, width: int = 140) -> None:
    """Write ``text`` under the figure's axes, wrapped; call after ``tight_layout``."""
    lines = textwrap.wrap(text, width)
    fig.subplots_adjust(bottom=max(fig.subplotpars.bottom, CAPTION_SPACE + 0.02 * len(lines)))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="dimgray", va="bottom", ha="left")


def legend_beside(ax, **kwargs) -> None:
    """The legend of ``ax`` to the right of it, outside the axes, so it hides
    no bar, line or point (:func:`save` keeps it in the file)."""
    ax.legend(
        loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small", **kwargs
    )


def save(fig, path: Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` with everything drawn outside its axes
    (a legend beside them, the caption) inside the image; close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def median_range(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values``, and how far below and above it their lowest and highest are."""
    mid = statistics.median(values)
    return mid, mid - min(values), max(values) - mid


def grouped_bars(ax, labels: list[str], series: dict[str, dict[str, list[float]]], fmt: str):
    """Bars of ``series`` (name: label: repeats' values) at each of
    ``labels``, side by side: the median, an error bar over the repeats, the
    value written above it (``fmt``), ``n/a`` where a series has none."""
    width = 0.8 / max(len(series), 1)
    for k, (name, values) in enumerate(series.items()):
        xs = [i + k * width for i in range(len(labels))]
        figures = [median_range(values[label]) if values.get(label) else None for label in labels]
        heights = [f[0] if f else 0.0 for f in figures]
        errors = [[f[1] if f else 0.0 for f in figures], [f[2] if f else 0.0 for f in figures]]
        bars = ax.bar(xs, heights, width, yerr=errors, capsize=3, label=name)
        texts = ["n/a" if f is None else fmt.format(f[0]) for f in figures]
        ax.bar_label(bars, texts, padding=2, fontsize=7)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.15)  # room for the value labels over the tallest bar


def report_head(title: str, command: str, elapsed_s: float) -> list[str]:
    """A report's first lines: its title, the exact command, the machine and
    how long it ran."""
    return [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}; total {elapsed_s:.0f} s.",
        "",
    ]
