import sys

from jaxdrive.bench.cli import main

sys.exit(main())
