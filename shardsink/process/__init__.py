"""Child processes, one lifecycle shape for all: started fresh or forked from
a zygote, dying with their parent, stopped, killed and restarted alike. Every
child runs ``python -m shardsink.process`` and a role named
``package.module:function`` (:mod:`.roles`)."""

from . import logs as logs
from .child import (
    RUN_MARK as RUN_MARK,
)
from .child import (
    Child as Child,
)
from .child import (
    Launch as Launch,
)
from .child import (
    Launched as Launched,
)
from .child import (
    Starter as Starter,
)
from .child import (
    kill_all as kill_all,
)
from .child import (
    marked as marked,
)
from .child import (
    peak_rss as peak_rss,
)
from .child import (
    reap as reap,
)
from .child import (
    reset_own_peak_rss as reset_own_peak_rss,
)
from .child import (
    sigint_ignored as sigint_ignored,
)
from .consensus import (
    ConsensusProcess as ConsensusProcess,
)
from .consensus import (
    ConsensusStartError as ConsensusStartError,
)
from .consensus import (
    Ready as Ready,
)
from .consensus import (
    through_restarts as through_restarts,
)
from .ready import NotReady as NotReady
from .ready import ParentChannel as ParentChannel
from .ready import wait_ready as wait_ready
from .roles import (
    MODULE as MODULE,
)
from .roles import (
    module_payload as module_payload,
)
from .roles import (
    resolve as resolve,
)
from .roles import (
    run_role as run_role,
)
from .rundir import make_run_dir as make_run_dir
from .rundir import remove_dead_run_dirs as remove_dead_run_dirs
from .spawn import SpawnStarter as SpawnStarter
from .zygote import Zygote as Zygote
from .zygote import ZygoteError as ZygoteError
