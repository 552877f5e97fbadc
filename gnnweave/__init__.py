"""gnnweave: GNN training on FPGAs next to GPUs (hardware/software co-design toolkit)."""
__version__ = "0.1.0"
