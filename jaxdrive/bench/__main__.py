import sys

from jaxdrive.bench.cli import main
from jaxdrive.command import run_command

sys.exit(run_command(main, "bench", compilation_cache=False))
