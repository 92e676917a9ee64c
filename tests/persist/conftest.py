"""Fixtures of the shard tests."""

from __future__ import annotations

import pytest

from tests.helpers.persist import memory_stores


@pytest.fixture(params=["memory", "file+sqlite"])
def stores(request, tmp_path) -> tuple[str, str]:
    """(blob URI, consensus URI): in memory, then on the embedded defaults."""
    if request.param == "memory":
        return memory_stores()
    return f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db"
