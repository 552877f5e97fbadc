"""The accelerator's driver: the run protocol and every unit's protocol, on one
:class:`~.io.RegisterIo`."""
from __future__ import annotations

from gnnweave.host.driver.aggregator import AggregatorProtocol
from gnnweave.host.driver.core import AccelCore
from gnnweave.host.driver.mac_array import MacArrayProtocol
from gnnweave.host.driver.pipeline import PipelineProtocol


class Accelerator(AggregatorProtocol, MacArrayProtocol, PipelineProtocol, AccelCore):
    """Every unit's methods (:meth:`aggregate`, :meth:`mac`, :meth:`train_pipeline`, ...)
    over the shared run protocol; a platform binding calls :meth:`_setup_core`."""
