"""python -m tools.trace：和 python course.py trace 一样（命令行在 cli.py）。"""

import sys

from tools.trace.cli import main

if __name__ == "__main__":
    sys.exit(main())
