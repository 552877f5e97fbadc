"""The ``gnnweave build`` sub-commands that need only the gateware (``add_arguments(parser)``
and ``run(args)`` each; :mod:`gnnweave.cli` mounts them)."""
