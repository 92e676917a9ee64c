"""``python -m shardsink.cluster PARENT spawn ROLE``: a cluster's child as a
fresh interpreter (see :mod:`shardsink.cluster.roles`)."""

import sys

from ..process import entry
from .roles import ROLES

sys.exit(entry.main(ROLES, sys.argv[1:]))
