"""Fixtures of the shm tests: a fresh cluster id and a private socket directory."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.helpers.shm import unique_cluster


@pytest.fixture
def cluster() -> str:
    """A cluster id of this test alone."""
    return unique_cluster()


@pytest.fixture
def endpoint():
    """An ``ipc://`` endpoint in a fresh directory of mode 0700, removed after."""
    directory = tempfile.mkdtemp(prefix="shardsink-test-")
    yield f"ipc://{directory}/builder.sock"
    shutil.rmtree(directory, ignore_errors=True)
