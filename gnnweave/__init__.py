"""gnnweave: GNN training on FPGAs next to GPUs (hardware/software co-design toolkit).

``gnnweave.train``, ``gnnweave.load_model`` and ``gnnweave.TrainedModel`` are the Python
front door (:mod:`gnnweave.api`); they load the runtime on first use, so ``import gnnweave``
stays light.
"""
__version__ = "0.1.0"

_API = ("train", "load_model", "TrainedModel")


def __getattr__(name):
    if name in _API:
        from gnnweave import api
        return getattr(api, name)
    raise AttributeError(f"module 'gnnweave' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
