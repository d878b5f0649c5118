"""`python -m licensectl` is the `licensectl` command."""

import sys

from licensectl.cli import main

sys.exit(main())
