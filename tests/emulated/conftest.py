"""Emulated clusters for these tests (the fixture proves each one gone)."""

from shardsink.testing.emulated_fixture import emulated_cluster

__all__ = ["emulated_cluster"]
