"""``python -m jaxdrive.train``: see ``jaxdrive.train.cli``."""

import sys

from jaxdrive.train.cli import main

sys.exit(main())
