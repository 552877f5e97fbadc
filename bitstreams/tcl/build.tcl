# --- address map, synthesis, implementation, bitstream, copy .bit + .hwh (same stem) ---
assign_bd_address
set ctrl_seg [get_bd_addr_segs -of_objects [get_bd_addr_spaces $ps_data] -filter {NAME =~ "*@INSTANCE@*"}]
if {[llength $ctrl_seg] != 1} { error "gnnweave: expected one address segment for s_axi_control, got '$ctrl_seg'" }
set_property offset @CONTROL_BASE@ $ctrl_seg
set_property range @CTRL_RANGE_BD@ $ctrl_seg
validate_bd_design
save_bd_design
set bd_file [get_files gnnweave.bd]
generate_target all $bd_file
add_files -norecurse [make_wrapper -files $bd_file -top]
set_property top gnnweave_wrapper [current_fileset]
update_compile_order -fileset sources_1
launch_runs synth_1 -jobs $jobs
wait_on_run synth_1
if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} { error "gnnweave: synthesis failed (see $proj_dir)" }
launch_runs impl_1 -to_step write_bitstream -jobs $jobs
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} { error "gnnweave: implementation failed (see $proj_dir)" }
set bit [lindex [glob -nocomplain [file join $proj_dir gnnweave.runs impl_1 *.bit]] 0]
set hwh [lindex [glob -nocomplain [file join $proj_dir gnnweave.gen sources_1 bd gnnweave hw_handoff gnnweave.hwh] \
                                  [file join $proj_dir gnnweave.srcs sources_1 bd gnnweave hw_handoff gnnweave.hwh]] 0]
if {$bit eq "" || $hwh eq ""} { error "gnnweave: bitstream or .hwh not found under $proj_dir" }
file mkdir $dest_dir
file copy -force $bit [file join $dest_dir gnnweave.bit]
file copy -force $hwh [file join $dest_dir gnnweave.hwh]
puts "gnnweave: wrote [file join $dest_dir gnnweave.bit] and gnnweave.hwh"
