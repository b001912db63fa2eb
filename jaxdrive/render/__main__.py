"""``python -m jaxdrive.render``: see ``jaxdrive.render.cli``."""

import sys

from jaxdrive.render.cli import main

sys.exit(main())
