"""Optional dependencies in tests: skip where an extra is not installed, fail where CI said
it must be (``GNNWEAVE_REQUIRE_TORCH=1``, set by ``.ci/run`` when it installed the ``gpu``
extra), so a broken install cannot turn into silently skipped oracles."""
import importlib
import os

import pytest

REQUIRED_BY = {"torch": "GNNWEAVE_REQUIRE_TORCH", "torch_geometric": "GNNWEAVE_REQUIRE_TORCH",
               "pymetis": "GNNWEAVE_REQUIRE_TORCH"}   # the dist extra, installed with gpu


def require(module: str):
    """The imported module, or a skip (a failure when its ``GNNWEAVE_REQUIRE_*`` is 1)."""
    env = REQUIRED_BY.get(module)
    if env and os.environ.get(env) == "1":
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            pytest.fail(f"{env}=1 but {module} does not import: {exc!r}")
    return pytest.importorskip(module)
