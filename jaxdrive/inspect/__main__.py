"""``python -m jaxdrive.inspect``: see ``jaxdrive.inspect.cli``."""

import sys

from jaxdrive.command import run_command
from jaxdrive.inspect.cli import main

sys.exit(run_command(main, "inspect"))
