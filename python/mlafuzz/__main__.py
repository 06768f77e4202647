"""``python -m mlafuzz ARGS`` and the ``mlafuzz`` console script: run the mlafuzz executable."""

from __future__ import annotations

import sys

from mlafuzz._executable import main

if __name__ == "__main__":
    sys.exit(main())
