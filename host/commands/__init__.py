"""The ``gnnweave`` sub-commands of the host runtime, one module each (``add_arguments(parser)``
and ``run(args)``; :mod:`gnnweave.cli` mounts them)."""
