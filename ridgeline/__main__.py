"""`python -m ridgeline ...`: the same command line as the `ridgeline` script."""
import sys

from ridgeline.cli import main

sys.exit(main())
