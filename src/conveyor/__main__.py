"""``python -m conveyor``: the same as the ``conveyor`` command."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
