"""``python -m shardsink.process PARENT spawn ROLE`` (or ``zygote FD ROLE...``):
the entry of every child process (see :mod:`shardsink.process.entry`)."""

import sys

from .entry import main

sys.exit(main(sys.argv[1:]))
