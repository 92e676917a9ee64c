"""Child processes, one lifecycle shape for all: started fresh or forked from
a zygote, dying with their parent, stopped, killed and restarted alike. Every
child runs ``python -m shardsink.process`` and a role named
``package.module:function`` (:mod:`.roles`)."""

from . import logs as logs
from .child import (
    RUN_MARK as RUN_MARK,
    Child as Child,
    Launch as Launch,
    Launched as Launched,
    Starter as Starter,
    kill_all as kill_all,
    marked as marked,
    peak_rss as peak_rss,
    reap as reap,
    reset_own_peak_rss as reset_own_peak_rss,
    sigint_ignored as sigint_ignored,
)
from .consensus import (
    ConsensusProcess as ConsensusProcess,
    ConsensusStartError as ConsensusStartError,
    Ready as Ready,
    through_restarts as through_restarts,
)
from .logs import file_name as file_name, log_dir as log_dir
from .parent import dies_with_this_process as dies_with_this_process
from .ready import NotReady as NotReady, ParentChannel as ParentChannel, wait_ready as wait_ready
from .roles import (
    MODULE as MODULE,
    enter_member as enter_member,
    module_payload as module_payload,
    resolve as resolve,
    run_role as run_role,
)
from .rundir import make_run_dir as make_run_dir, remove_dead_run_dirs as remove_dead_run_dirs
from .spawn import SpawnStarter as SpawnStarter
from .zygote import Zygote as Zygote, ZygoteError as ZygoteError
