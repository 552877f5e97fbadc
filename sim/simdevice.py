"""The simulated device under its former module name: everything is in
:mod:`gnnweave.sim.device` (import from there); these names stay importable from here."""
from gnnweave.sim.device import *  # noqa: F401,F403
from gnnweave.sim.device import __all__  # noqa: F401
from gnnweave.sim.device.build import bus_bytes as _bus_bytes  # noqa: F401
from gnnweave.sim.device.build import build_plan as _build_plan  # noqa: F401
from gnnweave.sim.device.build import cpu_identity as _cpu_identity  # noqa: F401
from gnnweave.sim.device.build import pgo_enabled as _pgo_enabled  # noqa: F401
from gnnweave.sim.device.jobs import pgo_train as _pgo_train  # noqa: F401
from gnnweave.sim.device.jobs import regmap as _regmap  # noqa: F401
