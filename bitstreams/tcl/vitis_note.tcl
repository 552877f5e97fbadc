# --- @BOARD_NAME@ has no processing system: the Vitis flow builds it, not this script ---
# The packaged IP above is an RTL kernel candidate (ap_clk/ap_rst_n, s_axi_control, m_axi_gmem
# of @BUS_WIDTH@ bits, interrupt). Package it as a .xo with package_xo and link with
#   v++ -l -t hw --platform <xilinx_u250 platform> @IP_NAME@.xo -o gnnweave.xclbin
# PYNQ then loads the .xclbin (no .bit/.hwh pair).
puts "gnnweave: @BOARD@ uses the Vitis flow (v++ link); IP packaged in $ip_repo, no block design built"
