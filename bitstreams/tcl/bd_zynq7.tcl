# --- block design: Zynq-7000 PS, @HP_PORT@ (@BUS_WIDTH@-bit), FCLK_CLK0 @CLOCK_MHZ@ MHz ---
set_property ip_repo_paths [list $ip_repo] [current_project]
update_ip_catalog
create_bd_design gnnweave
set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:processing_system7 processing_system7_0]
apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 \
    -config [list make_external {FIXED_IO, DDR} apply_board_preset [expr {$bp ne "" ? 1 : 0}] Master Disable Slave Disable] $ps
set_property -dict [list \
    CONFIG.PCW_USE_M_AXI_GP0 {1} \
    CONFIG.@PS_SLAVE_ENABLE@ {1} CONFIG.@PS_SLAVE_WIDTH@ {@BUS_WIDTH@} \
    CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {@CLOCK_MHZ@} \
    CONFIG.PCW_USE_FABRIC_INTERRUPT {1} CONFIG.PCW_IRQ_F2P_INTR {1}] $ps
set acc [create_bd_cell -type ip -vlnv @VLNV@ @INSTANCE@]
set clk /processing_system7_0/FCLK_CLK0
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Clk_master $clk Clk_slave $clk Clk_xbar $clk \
    Master /processing_system7_0/M_AXI_GP0 Slave /@INSTANCE@/s_axi_control intc_ip {New AXI Interconnect}] \
    [get_bd_intf_pins @INSTANCE@/s_axi_control]
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Clk_master $clk Clk_slave $clk Clk_xbar $clk \
    Master /@INSTANCE@/m_axi_gmem Slave /processing_system7_0/@HP_PORT@ intc_ip {Auto}] \
    [get_bd_intf_pins processing_system7_0/@HP_PORT@]
connect_bd_net [get_bd_pins @INSTANCE@/interrupt] [get_bd_pins processing_system7_0/IRQ_F2P]
set ps_data processing_system7_0/Data
