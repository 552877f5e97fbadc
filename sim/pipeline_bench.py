"""The training Pipeline's bench, by job in :mod:`gnnweave.sim.pipeline` (host, Amaranth
run, problems, builds, cocotb runs, split devices, SGC); its public names stay importable
from here."""
from .pipeline import *  # noqa: F401,F403
from .pipeline import __all__  # noqa: F401
