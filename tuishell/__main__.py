"""`python -m tuishell` is the same as the `tuishell` command."""

import sys

from tuishell.cli import main

sys.exit(main())
