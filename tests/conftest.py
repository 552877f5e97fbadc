"""What the suites need from the machine: skip where it is missing, fail where CI said it
must be there.

One switch per purpose, each set to ``1`` by ``.ci/run`` where it installed that part:

=============================  ==========================================================
``GNNWEAVE_REQUIRE_DATA``      the shared datasets and layer profiles
``GNNWEAVE_REQUIRE_PYNQ``      the genuine ``pynq`` package
``GNNWEAVE_REQUIRE_TORCH``     the ``gpu`` / ``dist`` extras (torch, torch_geometric, pymetis)
``GNNWEAVE_REQUIRE_ICARUS``    Icarus Verilog (``iverilog`` and ``vvp`` on ``PATH``)
=============================  ==========================================================

So a broken install cannot turn into silently skipped tests. Import the helpers with
``from tests.conftest import require, require_dataset, require_icarus, require_pynq``.
"""
from __future__ import annotations

import importlib
import os

import pytest

#: purpose -> the environment variable that makes its absence a failure
SWITCHES = {"data": "GNNWEAVE_REQUIRE_DATA", "pynq": "GNNWEAVE_REQUIRE_PYNQ",
            "torch": "GNNWEAVE_REQUIRE_TORCH", "icarus": "GNNWEAVE_REQUIRE_ICARUS"}
#: optional modules and the purpose whose switch covers them
MODULE_PURPOSE = {"torch": "torch", "torch_geometric": "torch",
                  "pymetis": "torch",   # the dist extra, installed with gpu
                  "pynq": "pynq"}


def required(purpose: str) -> bool:
    """True where CI said ``purpose`` must be present (its switch is ``1``)."""
    return os.environ.get(SWITCHES[purpose]) == "1"


def missing(purpose: str, reason: str):
    """Skip the test, or fail it where ``purpose`` is required."""
    if required(purpose):
        pytest.fail(f"{SWITCHES[purpose]}=1 but {reason}")
    # allowed at module level too: a test module may require an extra as it imports
    pytest.skip(reason, allow_module_level=True)


def require(module: str):
    """The imported optional module, or a skip (a failure under its switch)."""
    purpose = MODULE_PURPOSE.get(module)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if purpose is None:
            pytest.skip(f"{module} is not installed")
        missing(purpose, f"{module} does not import: {exc!r}")


def require_pynq():
    """The genuine pynq package, or a skip (a failure under ``GNNWEAVE_REQUIRE_PYNQ=1``)."""
    return require("pynq")


def require_icarus() -> None:
    """Icarus Verilog on PATH, or a skip (a failure under ``GNNWEAVE_REQUIRE_ICARUS=1``)."""
    from gnnweave.sim import toolchain
    if not toolchain.have_icarus():
        missing("icarus", "Icarus Verilog (iverilog, vvp) is not on PATH")


def require_dataset(name: str, **kw):
    """``load_dataset(name)``, or a skip where the file is not there (a failure under
    ``GNNWEAVE_REQUIRE_DATA=1``)."""
    from gnnweave.datasets import DatasetNotFoundError, load_dataset
    try:
        return load_dataset(name, **kw)
    except DatasetNotFoundError as exc:
        missing("data", f"dataset {name!r} not found ({exc}; set GNNWEAVE_DATA)")


def require_file(path, what: str = "data file"):
    """``path`` where it exists, or a skip (a failure under ``GNNWEAVE_REQUIRE_DATA=1``)."""
    from pathlib import Path
    if not Path(path).exists():
        missing("data", f"{what} {path} is missing")
    return path
