"""cocotb test benches, simulator runners and the simulated device."""
