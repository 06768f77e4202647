"""Entry point of the worker process: ``python -m mlafuzz._worker`` (the mlafuzz executable
starts it for a python: backend). The worker itself is the mlafuzz.worker package."""

import sys

from mlafuzz.worker.loader import load_kernel  # noqa: F401 - mlafuzz.testing imports it here
from mlafuzz.worker.server import main

if __name__ == "__main__":
    sys.exit(main())
