"""Amaranth gateware: units, AXI plumbing, register map, accelerator top, Verilog generation."""
import time

#: When this process imported the gateware. A source file changed after this may differ from
#: the code in memory, so Verilog generated now must not be cached under the file's hash.
LOADED_AT = time.time()
