"""``python -m gnnweave.hw.estimate CONFIG ...``: the resource, logic-depth and timing
estimate of the build flow, :mod:`gnnweave.hw.flow.estimate` (documented in docs/estimate.md)."""
import sys

from .flow.estimate import main

if __name__ == "__main__":
    sys.exit(main())
