"""``python -m jaxdrive.eval``: see ``jaxdrive.eval.cli``."""

import sys

from jaxdrive.command import run_command
from jaxdrive.eval.cli import main

sys.exit(run_command(main, "eval"))
