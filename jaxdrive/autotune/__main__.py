import sys

from jaxdrive.autotune.cli import main

sys.exit(main())
