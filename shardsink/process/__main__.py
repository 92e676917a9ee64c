"""``python -m shardsink.process PARENT spawn module``: any ``python -m``
command as a child that dies with its parent (payload:
:func:`~shardsink.process.roles.module_payload`)."""

import sys

from .entry import main
from .roles import run_module

sys.exit(main({"module": run_module}, sys.argv[1:]))
