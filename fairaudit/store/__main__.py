"""`python -m fairaudit.store verify|export|import`: `fairaudit store`."""

import sys

from fairaudit.store.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
