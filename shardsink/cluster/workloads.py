"""Moved to :mod:`shardsink.workloads`; this alias goes once chaos imports it from there."""

import sys

from .. import workloads

sys.modules[__name__] = workloads
