"""`python -m disagg`: the `disagg` command line."""

import sys

from disagg.cli import main

sys.exit(main())
