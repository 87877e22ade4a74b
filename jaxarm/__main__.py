"""``python -m jaxarm``: the ``jaxarm`` command (see :mod:`jaxarm.cli`)."""

import sys

from .cli import main

sys.exit(main())
