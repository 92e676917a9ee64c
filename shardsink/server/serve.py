"""``python -m shardsink.server.serve PARENT spawn consensus``: a consensus
server as a child process (see :mod:`shardsink.process.consensus`)."""

from __future__ import annotations

import sys

from ..process import entry
from ._cli import serve_role

ROLES = {"consensus": serve_role}

if __name__ == "__main__":
    sys.exit(entry.main(ROLES, sys.argv[1:]))
