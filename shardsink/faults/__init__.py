"""Fault injection: named fault points that kill, pause or fail a process at a
precise moment, by seed (:mod:`.points`: the registry, arming, budgets, the
record of firings), and the store wrappers that inject failures into every
call of a ``Blob`` or ``Consensus`` (:mod:`.stores`).

Code marks a moment with ``faults.point("builder.after_upload")``; a store
that the ``blob.call`` / ``consensus.call`` points must reach is opened with
:func:`open_blob` / :func:`open_consensus` (open, then wrap if armed).
``shardsink.storage`` knows nothing of faults.
"""

from .points import (
    ENV_DIR as ENV_DIR,
)
from .points import (
    ENV_FAULTS as ENV_FAULTS,
)
from .points import (
    ENV_PAUSE as ENV_PAUSE,
)
from .points import (
    ENVIRONMENT as ENVIRONMENT,
)
from .points import (
    POINTS as POINTS,
)
from .points import (
    STORE_POINTS as STORE_POINTS,
)
from .points import (
    FaultSpec as FaultSpec,
)
from .points import (
    arm as arm,
)
from .points import (
    arm_from_env as arm_from_env,
)
from .points import (
    disarm as disarm,
)
from .points import (
    environ as environ,
)
from .points import (
    fired as fired,
)
from .points import (
    hold as hold,
)
from .points import (
    open_blob as open_blob,
)
from .points import (
    open_consensus as open_consensus,
)
from .points import (
    parse as parse,
)
from .points import (
    point as point,
)
from .points import (
    release as release,
)
from .points import (
    run_budgets as run_budgets,
)
from .points import (
    slot_name as slot_name,
)
from .points import (
    wrap_store as wrap_store,
)
from .stores import FaultyBlob as FaultyBlob
from .stores import FaultyConsensus as FaultyConsensus
