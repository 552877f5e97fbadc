"""Amaranth gateware: units, AXI plumbing, register map, accelerator top, Verilog generation."""
