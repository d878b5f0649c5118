"""`python -m licensectl` is the `licensectl` command."""

import sys

from licensectl.cli.main import main

sys.exit(main())
