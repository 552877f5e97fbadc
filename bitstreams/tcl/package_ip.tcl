# --- IP packaging of the generated Verilog (@IP_VENDOR@:@IP_LIBRARY@:@IP_NAME@:@IP_VERSION@) ---
# ipx::infer_core reads the Verilog in ip_src; AXI interfaces come from the port prefixes:
# s_axi_control_* -> AXI4-Lite slave, m_axi_gmem_* -> AXI4 master; ap_clk/ap_rst_n associated.
set ip_src  [file normalize "@IP_SRC@"]
set ip_repo [file normalize "@IP_REPO@"]
file delete -force $ip_repo
file mkdir $ip_repo
file copy -force [file join $ip_src @IP_NAME@.v] $ip_repo
ipx::infer_core -vendor @IP_VENDOR@ -library @IP_LIBRARY@ -name @IP_NAME@ -version @IP_VERSION@ -taxonomy /UserIP $ip_repo
ipx::open_core [file join $ip_repo component.xml]
set core [ipx::current_core]
# infer_core may ignore -name/-version: set the VLNV the driver matches explicitly
set_property vendor @IP_VENDOR@ $core
set_property library @IP_LIBRARY@ $core
set_property name @IP_NAME@ $core
set_property version @IP_VERSION@ $core
set_property display_name "gnnweave accelerator (@CONFIG@: @UNITS@)" $core
ipx::infer_bus_interfaces xilinx.com:interface:aximm_rtl:1.0 $core
ipx::infer_bus_interfaces xilinx.com:signal:clock_rtl:1.0 $core
ipx::infer_bus_interfaces xilinx.com:signal:reset_rtl:1.0 $core
ipx::infer_bus_interfaces xilinx.com:signal:interrupt_rtl:1.0 $core
foreach busif {s_axi_control m_axi_gmem} {
    if {[llength [ipx::get_bus_interfaces $busif -of_objects $core]] == 0} {
        error "gnnweave: IP packager did not infer the $busif AXI interface from the port names"
    }
}
ipx::associate_bus_interfaces -busif s_axi_control -clock ap_clk $core
ipx::associate_bus_interfaces -busif m_axi_gmem -clock ap_clk $core
ipx::associate_bus_interfaces -clock ap_clk -reset ap_rst_n $core
set rst [ipx::get_bus_interfaces ap_rst_n -of_objects $core]
set pol [ipx::get_bus_parameters POLARITY -of_objects $rst]
if {[llength $pol] == 0} { set pol [ipx::add_bus_parameter POLARITY $rst] }
set_property value ACTIVE_LOW $pol
set irq [ipx::get_bus_interfaces interrupt -of_objects $core]
if {[llength $irq] != 0} {
    set sens [ipx::get_bus_parameters SENSITIVITY -of_objects $irq]
    if {[llength $sens] == 0} { set sens [ipx::add_bus_parameter SENSITIVITY $irq] }
    set_property value LEVEL_HIGH $sens
}
# The PYNQ driver reads these from the .hwh: fixed, informational user parameters
# (names and values from gnnweave/contract.py: IpParameters).
foreach {pname pvalue} {@IP_PARAMETERS@} {
    set p [ipx::add_user_parameter $pname $core]
    set_property value_resolve_type user $p
    set_property value $pvalue $p
    set_property value_format long $p
    set_property enablement_value false $p
}
# register map of s_axi_control (hw/regmap.py), so the .hwh carries it for PYNQ's register_map
set mm [ipx::get_memory_maps s_axi_control -of_objects $core]
if {[llength $mm] == 0} {
    set mm [ipx::add_memory_map s_axi_control $core]
    set_property slave_memory_map_ref s_axi_control [ipx::get_bus_interfaces s_axi_control -of_objects $core]
}
set blk [ipx::get_address_blocks Reg -of_objects $mm]
if {[llength $blk] == 0} { set blk [ipx::add_address_block Reg $mm] }
set_property range @CTRL_RANGE@ $blk
set_property usage register $blk
foreach {rname roffset rsize} {
@REGISTERS@
} {
    set r [ipx::add_register $rname $blk]
    set_property address_offset $roffset $r
    set_property size $rsize $r
}
ipx::create_xgui_files $core
ipx::update_checksums $core
ipx::check_integrity $core
ipx::save_core $core
ipx::unload_core [file join $ip_repo component.xml]
