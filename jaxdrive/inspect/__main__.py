"""``python -m jaxdrive.inspect``: see ``jaxdrive.inspect.cli``."""

import sys

from jaxdrive.inspect.cli import main

sys.exit(main())
