"""``python -m retrievers index build ...`` / ``python -m retrievers serve-retriever ...``."""

from __future__ import annotations

import sys

from retrievers.cli import main

if __name__ == "__main__":
    sys.exit(main())
