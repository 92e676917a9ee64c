"""Helpers of the tests that run ``shardsink`` as a user does: the command in
a child interpreter, a realtime ``up`` left running, a Prometheus scrape."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
#: The environment of a child ``shardsink``: this checkout's package.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def shardsink(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``shardsink ARGS`` run to its end, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "shardsink.cli", *args],
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_up(popen, data: Path, *args: str) -> tuple[subprocess.Popen, str, str]:
    """``shardsink up --data-dir DATA --json ARGS`` through ``popen``, once
    every process is up: the process, the cluster's id and ``up``'s second
    line (pid, addresses, how to stop), checked to name the process."""
    proc = popen(
        [sys.executable, "-m", "shardsink.cli", "up", "--data-dir", str(data), "--json", *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stderr.readline()
    assert first.startswith("cluster "), first + proc.stderr.read()
    second = proc.stderr.readline()
    assert f"coordinator pid {proc.pid}" in second and "shardsink stop --data-dir" in second
    return proc, first.split()[1].rstrip(":"), second


def scrape(url: str) -> dict[str, float]:
    """Every sample of the Prometheus page at ``url``, by name and labels
    (``name{k=v,...}``), parsed with prometheus_client's parser."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples
