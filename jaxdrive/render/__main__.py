"""``python -m jaxdrive.render``: see ``jaxdrive.render.cli``."""

import sys

from jaxdrive.command import run_command
from jaxdrive.render.cli import main

sys.exit(run_command(main, "render"))
