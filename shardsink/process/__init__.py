"""Child processes, one lifecycle shape for all: started fresh or forked from
a zygote, dying with their parent, stopped, killed and restarted alike."""

from .child import (
    Child,
    Launch,
    Running,
    Starter,
    kill_all,
    marked,
    peak_rss,
    reap,
    reset_own_peak_rss,
)
from .consensus import ConsensusProcess, ConsensusStartError
from .parent import die_with_parent
from .roles import Role, Roles, module_payload, run_module, run_role
from .rundir import make_run_dir, remove_dead_run_dirs
from .spawn import SpawnStarter, child_env
from .zygote import Zygote, ZygoteError, fork_is_safe

__all__ = [
    "Child",
    "ConsensusProcess",
    "ConsensusStartError",
    "Launch",
    "Role",
    "Roles",
    "Running",
    "SpawnStarter",
    "Starter",
    "Zygote",
    "ZygoteError",
    "child_env",
    "die_with_parent",
    "fork_is_safe",
    "kill_all",
    "make_run_dir",
    "marked",
    "module_payload",
    "peak_rss",
    "reap",
    "remove_dead_run_dirs",
    "reset_own_peak_rss",
    "run_module",
    "run_role",
]
