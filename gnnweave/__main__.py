"""``python -m gnnweave``: the command line (what ``torchrun -m gnnweave train --dist`` runs)."""
from gnnweave.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
