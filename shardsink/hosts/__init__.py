"""A cluster's hosts: the agent that runs one host's processes
(:mod:`.agent`), and agents placed on the nodes of a Ray cluster
(:mod:`.ray`, with ``pip install 'shardsink[ray]'``)."""

from .agent import (
    AgentReply as AgentReply,
    Kill as Kill,
    Locate as Locate,
    LogFiles as LogFiles,
    Logs as Logs,
    Poll as Poll,
    Polled as Polled,
    Start as Start,
    StartChild as StartChild,
    Started as Started,
    Sweep as Sweep,
    Tail as Tail,
    Text as Text,
)
from .ray import (
    AgentError as AgentError,
    AgentGone as AgentGone,
    RemoteAgent as RemoteAgent,
    alive_nodes as alive_nodes,
    connect as connect,
    inherited_env as inherited_env,
    keep_loopback as keep_loopback,
    locate as locate,
    place_agent as place_agent,
    place_agents as place_agents,
)
