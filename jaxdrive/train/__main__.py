"""``python -m jaxdrive.train``: see ``jaxdrive.train.cli``."""

import sys

from jaxdrive.command import run_command
from jaxdrive.train.cli import main

sys.exit(run_command(main, "train"))
