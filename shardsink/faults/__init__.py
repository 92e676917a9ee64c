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
    ENV_FAULTS as ENV_FAULTS,
    ENV_PAUSE as ENV_PAUSE,
    ENVIRONMENT as ENVIRONMENT,
    POINTS as POINTS,
    STORE_POINTS as STORE_POINTS,
    FaultSpec as FaultSpec,
    arm as arm,
    arm_from_env as arm_from_env,
    disarm as disarm,
    environ as environ,
    fired as fired,
    hold as hold,
    open_blob as open_blob,
    open_consensus as open_consensus,
    parse as parse,
    point as point,
    release as release,
    run_budgets as run_budgets,
    slot_name as slot_name,
    wrap_store as wrap_store,
)
from .stores import FaultyBlob as FaultyBlob, FaultyConsensus as FaultyConsensus
