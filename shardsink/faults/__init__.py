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
    ACTIONS,
    ENV_DIR,
    ENV_FAULTS,
    ENV_PAUSE,
    ENV_SEED,
    ENVIRONMENT,
    POINTS,
    STORE_POINTS,
    FaultSpec,
    arm,
    arm_from_env,
    disarm,
    environ,
    fired,
    hold,
    open_blob,
    open_consensus,
    parse,
    point,
    release,
    run_budgets,
    slot_name,
    wrap_store,
)
from .stores import FaultyBlob, FaultyConsensus

__all__ = [
    "ACTIONS",
    "ENVIRONMENT",
    "ENV_DIR",
    "ENV_FAULTS",
    "ENV_PAUSE",
    "ENV_SEED",
    "POINTS",
    "STORE_POINTS",
    "FaultSpec",
    "FaultyBlob",
    "FaultyConsensus",
    "arm",
    "arm_from_env",
    "disarm",
    "environ",
    "fired",
    "hold",
    "open_blob",
    "open_consensus",
    "parse",
    "point",
    "release",
    "run_budgets",
    "slot_name",
    "wrap_store",
]
