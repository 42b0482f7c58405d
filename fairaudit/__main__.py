"""`python -m fairaudit`: the `fairaudit` command (`fairaudit.cli.main`)."""

import sys

from fairaudit.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
