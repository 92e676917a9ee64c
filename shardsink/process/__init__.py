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
from .parent import die_with_parent
from .roles import Role, Roles, run_role
from .spawn import SpawnStarter, child_env
from .zygote import Zygote, ZygoteError, fork_is_safe

__all__ = [
    "Child",
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
    "marked",
    "peak_rss",
    "reap",
    "reset_own_peak_rss",
    "run_role",
]
