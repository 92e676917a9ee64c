"""Emulated hosts for the netns tests (the fixture proves each network gone)."""

from shardsink.testing.netns import netns_network

__all__ = ["netns_network"]
