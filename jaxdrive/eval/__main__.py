"""``python -m jaxdrive.eval``: see ``jaxdrive.eval.cli``."""

import sys

from jaxdrive.eval.cli import main

sys.exit(main())
