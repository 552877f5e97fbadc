# --- block design: Zynq UltraScale+ PS, @HP_PORT@ (@BUS_WIDTH@-bit), pl_clk0 @CLOCK_MHZ@ MHz ---
set_property ip_repo_paths [list $ip_repo] [current_project]
update_ip_catalog
create_bd_design gnnweave
set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e zynq_ps]
if {$bp ne ""} {
    apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {apply_board_preset "1"} $ps
}
set_property -dict [list \
    CONFIG.PSU__USE__M_AXI_GP0 {1} CONFIG.PSU__MAXIGP0__DATA_WIDTH {32} \
    CONFIG.PSU__USE__M_AXI_GP1 {0} CONFIG.PSU__USE__M_AXI_GP2 {0} \
    CONFIG.@PS_SLAVE_ENABLE@ {1} CONFIG.@PS_SLAVE_WIDTH@ {@BUS_WIDTH@} \
    CONFIG.PSU__FPGA_PL0_ENABLE {1} CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {@CLOCK_MHZ@} \
    CONFIG.PSU__USE__IRQ0 {1}] $ps
set acc [create_bd_cell -type ip -vlnv @VLNV@ @INSTANCE@]
set clk /zynq_ps/pl_clk0
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Clk_master $clk Clk_slave $clk Clk_xbar $clk \
    Master /zynq_ps/M_AXI_HPM0_FPD Slave /@INSTANCE@/s_axi_control intc_ip {New AXI Interconnect}] \
    [get_bd_intf_pins @INSTANCE@/s_axi_control]
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Clk_master $clk Clk_slave $clk Clk_xbar $clk \
    Master /@INSTANCE@/m_axi_gmem Slave /zynq_ps/@HP_PORT@ intc_ip {Auto}] \
    [get_bd_intf_pins zynq_ps/@HP_PORT@]
connect_bd_net [get_bd_pins @INSTANCE@/interrupt] [get_bd_pins zynq_ps/pl_ps_irq0]
set ps_data zynq_ps/Data
