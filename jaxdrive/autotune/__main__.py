import sys

from jaxdrive.autotune.cli import main
from jaxdrive.command import run_command

sys.exit(run_command(main, "autotune", compilation_cache=False))
