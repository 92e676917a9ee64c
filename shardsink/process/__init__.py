"""Child processes, one lifecycle shape for all: started fresh or forked from
a zygote, dying with their parent, stopped, killed and restarted alike. Every
child runs ``python -m shardsink.process`` and a role named
``package.module:function`` (:mod:`.roles`)."""

from . import logs
from .child import (
    RUN_MARK,
    Child,
    Launch,
    Launched,
    Running,
    Starter,
    kill_all,
    marked,
    peak_rss,
    reap,
    reset_own_peak_rss,
    sigint_ignored,
)
from .consensus import ConsensusProcess, ConsensusStartError, Ready, through_restarts
from .parent import die_with_parent, dies_with_this_process
from .ready import NotReady, ParentChannel, wait_ready
from .roles import MODULE, enter_member, module_payload, resolve, run_module, run_role
from .rundir import make_run_dir, remove_dead_run_dirs
from .spawn import SpawnStarter, child_env
from .zygote import Zygote, ZygoteError, fork_is_safe

__all__ = [
    "MODULE",
    "RUN_MARK",
    "Child",
    "ConsensusProcess",
    "ConsensusStartError",
    "Launch",
    "Launched",
    "NotReady",
    "ParentChannel",
    "Ready",
    "Running",
    "SpawnStarter",
    "Starter",
    "Zygote",
    "ZygoteError",
    "child_env",
    "die_with_parent",
    "dies_with_this_process",
    "enter_member",
    "fork_is_safe",
    "kill_all",
    "logs",
    "make_run_dir",
    "marked",
    "module_payload",
    "peak_rss",
    "reap",
    "remove_dead_run_dirs",
    "reset_own_peak_rss",
    "resolve",
    "run_module",
    "run_role",
    "sigint_ignored",
    "through_restarts",
    "wait_ready",
]
