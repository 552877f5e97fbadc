"""The generated Vivado scripts: per board, they parse as Tcl and run against stubbed Vivado
commands in plain ``tclsh`` (recording what Vivado would be asked to do)."""
import shutil
import subprocess

import pytest

import re

from gnnweave.contract import VLNV, IpParameters
from gnnweave.hw.flow import bitstream
from gnnweave.hw.flow.boards import boards, get_board
from gnnweave.hw.configs import get_config, get_mac_config, get_pipeline_config

TCLSH = shutil.which("tclsh")
needs_tclsh = pytest.mark.skipif(TCLSH is None, reason="tclsh not installed")
BOARDS = sorted(boards())

# Every Vivado command is unknown to tclsh: record it and answer like Vivado would enough
# for the script to continue (one handle per query, runs at 100%, no board files installed).
STUB = r"""
set ::log [open [lindex $argv 1] w]
proc unknown {args} {
    puts $::log $args
    set cmd [lindex $args 0]
    if {$cmd eq "get_board_parts"} { return "" }
    if {$cmd eq "get_property" && [lindex $args 1] eq "PROGRESS"} { return "100%" }
    if {$cmd eq "make_wrapper"} { return "gnnweave_wrapper.v" }
    return "handle_[string map {:: _} $cmd]"
}
source [lindex $argv 0]
"""


def _fake_verilog(config_name, out_dir, **kw):
    # Verilog generation takes ~12 s per board; the script tests only need the file to exist
    # (test_real_verilog_for_pynqz2 checks the real one)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gnnweave.v"
    path.write_text(f"// fake {config_name}\n")
    return path


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bitstream, "write_accelerator_verilog", _fake_verilog)
        for key in BOARDS:
            d = tmp_path_factory.mktemp(key)
            out[key] = bitstream.write_project(key, d, dest_dir=d / "dest")
    return out


@pytest.mark.parametrize("key", BOARDS)
def test_script_names_part_ports_and_verilog(scripts, key):
    board = get_board(key)
    script = scripts[key]
    text = script.read_text()
    assert script.name == f"build_{key}.tcl"
    assert f'set part      "{board.part}"' in text
    assert "ipx::infer_core -vendor gnnweave -library hls -name gnnweave -version 1.0" in text
    assert "s_axi_control" in text and "m_axi_gmem" in text and "ap_rst_n" in text
    assert (script.parent / "src" / "gnnweave.v").read_text() == f"// fake {board.config}\n"
    # the .hwh Vivado writes carries the limits the driver checks before touching the device
    pipe = get_pipeline_config(board.config)
    for name in IpParameters.PIPELINE_LIMITS:
        value = getattr(pipe, name) if pipe is not None else 0
        assert f"C_PIPE_{name.upper()} {value}" in text, name


@pytest.mark.parametrize("key", BOARDS)
def test_ip_parameters_are_the_contracts(scripts, key):
    # the script's C_* list, read back the way the driver reads a .hwh, gives the build's limits
    board = get_board(key)
    listed = re.search(r"foreach \{pname pvalue\} \{([^}]*)\}", scripts[key].read_text())[1].split()
    params = dict(zip(listed[::2], listed[1::2]))
    assert set(params) == set(IpParameters.HWH_NAMES.values())
    got = IpParameters.from_hwh(params)
    cfg, mac = get_config(board.config), get_mac_config(board.config)
    assert got.gmem_data_width == cfg.bus_width and got.max_feat_dim == cfg.max_feat_dim
    assert got.mac_max_depth == (mac.max_depth if mac is not None else 0)


def test_real_verilog_for_pynqz2(tmp_path):
    board = get_board("pynqz2")
    script = bitstream.write_project(board, tmp_path, dest_dir=tmp_path / "dest")
    verilog = (script.parent / "src" / "gnnweave.v").read_text()
    cfg = get_config(board.config)
    # the Verilog carries the ports the packager infers, at the board config's bus width
    assert "input ap_clk" in verilog and "input ap_rst_n" in verilog and "output interrupt" in verilog
    assert f"m_axi_gmem_rdata" in verilog and "s_axi_control_awaddr" in verilog.lower()
    assert f"[{cfg.bus_width - 1}:0] m_axi_gmem_rdata" in verilog


@needs_tclsh
@pytest.mark.parametrize("key", BOARDS)
def test_script_is_complete_tcl(scripts, key):
    text = scripts[key].read_text()
    check = 'set f [open [lindex $argv 0]]; set s [read $f]; puts [info complete $s]'
    r = subprocess.run([TCLSH, "/dev/stdin", str(scripts[key])], input=check,
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "1"
    # an unbalanced brace makes it incomplete (the check can fail)
    broken = scripts[key].with_suffix(".broken.tcl")
    broken.write_text(text.replace("} {", " {", 1) if "} {" in text else text + "\n{")
    r = subprocess.run([TCLSH, "/dev/stdin", str(broken)], input=check,
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "0"


def _dry_run(script, tmp_path):
    stub = tmp_path / "stub.tcl"
    stub.write_text(STUB)
    log = tmp_path / "vivado_calls.log"
    r = subprocess.run([TCLSH, str(stub), str(script), str(log)], capture_output=True, text=True,
                       cwd=script.parent)
    return r, log.read_text().splitlines()


@needs_tclsh
@pytest.mark.parametrize("key", ["zcu104", "kv260", "ultra96v2", "pynqz2"])
def test_dry_run_zynq_block_design(scripts, key, tmp_path):
    board = get_board(key)
    cfg = get_config(board.config)
    r, calls = _dry_run(scripts[key], tmp_path)
    # runs through to the copy step, where a dry run has no .bit
    assert "bitstream or .hwh not found" in r.stderr, r.stderr
    assert any(c.startswith("create_project -force gnnweave") and c.endswith(f"-part {board.part}")
               for c in calls)
    text = "\n".join(calls)
    base = "0xA0000000" if board.ps_type == "zynq_ultra_ps_e" else "0x43C00000"
    assert f"set_property offset {base}" in text
    ps_ip = "zynq_ultra_ps_e" if board.ps_type == "zynq_ultra_ps_e" else "processing_system7"
    assert f"xilinx.com:ip:{ps_ip}" in text
    assert f"Slave /{'zynq_ps' if ps_ip == 'zynq_ultra_ps_e' else 'processing_system7_0'}/{board.hp_ports[0].name}" in text
    assert f"DATA_WIDTH {cfg.bus_width}" in text
    assert f"C_MAX_FEAT_DIM" in text and f"set_property value {cfg.max_feat_dim}" in text
    assert "launch_runs impl_1 -to_step write_bitstream" in text
    assert "ipx::associate_bus_interfaces -busif s_axi_control -clock ap_clk" in text
    # the VLNV the driver and the simulated device's .hwh use, field by field
    for prop, value in zip(("vendor", "library", "name", "version"), VLNV.split(":")):
        assert f"set_property {prop} {value} handle_ipx_current_core" in text
    from gnnweave.hw.accelerator import INSTANCE_NAME, build_regmap
    assert f"create_bd_cell -type ip -vlnv {VLNV} {INSTANCE_NAME}" in text
    for name in IpParameters.HWH_NAMES.values():
        assert f"ipx::add_user_parameter {name} handle_ipx_current_core" in text
    # the register map of the accelerator top reaches the IP (hence the .hwh): every register
    for reg in build_regmap(board.config):
        assert f"ipx::add_register {reg.name}" in text


@needs_tclsh
def test_dry_run_alveo_points_to_vitis(scripts, tmp_path):
    r, calls = _dry_run(scripts["alveo-u250"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Vitis flow" in r.stdout
    assert not any(c.startswith("create_bd_design") for c in calls)


def test_run_without_vivado_names_script(tmp_path, monkeypatch):
    monkeypatch.setattr(bitstream, "write_accelerator_verilog", _fake_verilog)
    monkeypatch.setenv("PATH", str(tmp_path))   # no vivado here
    with pytest.raises(bitstream.VivadoNotFoundError, match=r"vivado -mode batch -source .*build_pynqz2\.tcl"):
        bitstream.build_bitstream("pynqz2", tmp_path / "proj")
    assert (tmp_path / "proj" / "build_pynqz2.tcl").is_file()


def test_unknown_board():
    with pytest.raises(ValueError, match="unknown board"):
        bitstream.write_project("zcu999", "/nonexistent")


def test_cli_without_vivado_names_script(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bitstream, "write_accelerator_verilog", _fake_verilog)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bitstream.main(["kv260", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: vivado is not on PATH") and "build_kv260.tcl" in err
    assert bitstream.main(["zcu999"]) == 2
    assert "unknown board 'zcu999'" in capsys.readouterr().err
