"""The ``gnnweave`` sub-commands of the simulators (``add_arguments(parser)`` and ``run(args)``
each; :mod:`gnnweave.cli` mounts them)."""
