"""``python -m shardsink.cli``: the ``shardsink`` command."""

import sys

from . import main

sys.exit(main())
