"""The consensus server (one process that serializes every shard's state
changes) and its client, a shard machine over ZeroMQ."""

from .client import ServerClient as ServerClient
from .server import ConsensusServer as ConsensusServer
