"""The consensus server (one process that serializes every shard's state
changes) and its client, a shard machine over ZeroMQ."""

from .client import RemoteMachine, ServerClient
from .server import ConsensusServer

__all__ = ["ConsensusServer", "RemoteMachine", "ServerClient"]
