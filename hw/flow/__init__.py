"""The build flow of the gateware: Verilog generation (:mod:`.verilog`), lint waivers
(:mod:`.lint`), resource, logic-depth and timing estimates (:mod:`.estimate`, :mod:`.depth`),
the analytic budget (:mod:`.budget`), the board catalogue (:mod:`.boards`) and the Vivado
project (:mod:`.bitstream`). The gateware it builds lives one level up, in ``gnnweave.hw``."""
