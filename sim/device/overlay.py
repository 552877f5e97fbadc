"""Overlay files for the simulated device: a Vivado-style ``.hwh`` written from the register
map and a dummy ``.bit``, so ``pynq.Overlay(path, device=SimDevice(...))`` binds the driver."""
from __future__ import annotations

from pathlib import Path

from gnnweave.contract import INSTANCE_NAME as IP_NAME  # noqa: F401 - re-exported
from gnnweave.contract import VLNV, IpParameters

from .jobs import regmap
from .native import DEFAULT_MEM_BASE

#: Where the control slave sits in the PS address map (an M_AXI_HPM0_LPD-like window).
CONTROL_BASE = 0xA000_0000


def hwh_text(regmap, *, control_base: int = CONTROL_BASE, instance: str = IP_NAME,
             vlnv: str = VLNV, mem_base: int = DEFAULT_MEM_BASE, mem_size: int = 1 << 28,
             max_feat_dim: int = 64, bus_width: int = 128, mac_max_depth: int = 0,
             pipeline: dict | None = None) -> str:
    """A Vivado-style ``.hwh``: a Zynq UltraScale+ PS whose master maps ``instance``'s
    ``s_axi_control`` at ``control_base`` (registers from ``regmap``), and the
    accelerator's ``m_axi_gmem`` master reaching the PS's HP slave port."""
    import xml.etree.ElementTree as ET

    high = control_base + regmap.size - 1
    root = ET.Element("EDKSYSTEM", EDWVERSION="1.2", TIMESTAMP="0", VIVADOVERSION="2022.1")
    ET.SubElement(root, "SYSTEMINFO", ARCH="zynquplus", DEVICE="xczu7ev", NAME="gnnweave_sim",
                  PACKAGE="ffvc1156", SPEEDGRADE="-2")
    ET.SubElement(root, "EXTERNALPORTS")
    modules = ET.SubElement(root, "MODULES")
    ps = ET.SubElement(modules, "MODULE", COREREVISION="0", FULLNAME="/zynq_ultra_ps_e_0",
                       HWVERSION="3.4", INSTANCE="zynq_ultra_ps_e_0", IPTYPE="PERIPHERAL",
                       IS_ENABLE="1", IS_PL="FALSE", MODCLASS="PROCESSOR",
                       MODTYPE="zynq_ultra_ps_e", VLNV="xilinx.com:ip:zynq_ultra_ps_e:3.4")
    ps_params = ET.SubElement(ps, "PARAMETERS")
    for clk in range(4):   # PL clocks as pynq's parser reads them (PL0: 100 MHz)
        ET.SubElement(ps_params, "PARAMETER", NAME=f"PSU__FPGA_PL{clk}_ENABLE",
                      VALUE="1" if clk == 0 else "0")
        for div, value in ((0, 15), (1, 1)):
            ET.SubElement(ps_params, "PARAMETER",
                          NAME=f"PSU__CRL_APB__PL{clk}_REF_CTRL__DIVISOR{div}", VALUE=str(value))
    mm = ET.SubElement(ps, "MEMORYMAP")
    ET.SubElement(mm, "MEMRANGE", ADDRESSBLOCK="Reg", BASENAME="C_S_AXI_CONTROL_BASEADDR",
                  BASEVALUE=f"0x{control_base:08X}", HIGHNAME="C_S_AXI_CONTROL_HIGHADDR",
                  HIGHVALUE=f"0x{high:08X}", INSTANCE=instance, IS_DATA="TRUE",
                  IS_INSTRUCTION="TRUE", MASTERBUSINTERFACE="M_AXI_HPM0_FPD", MEMTYPE="REGISTER",
                  SLAVEBUSINTERFACE="s_axi_control")
    ET.SubElement(ps, "PORTS")
    bifs = ET.SubElement(ps, "BUSINTERFACES")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="ps_M_AXI_HPM0_FPD", DATAWIDTH="128",
                  NAME="M_AXI_HPM0_FPD", TYPE="MASTER", VLNV="xilinx.com:interface:aximm:1.0")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="gmem_S_AXI_HP0_FPD", DATAWIDTH="128",
                  NAME="S_AXI_HP0_FPD", TYPE="SLAVE", VLNV="xilinx.com:interface:aximm:1.0")

    ip = ET.SubElement(modules, "MODULE", COREREVISION="1", FULLNAME=f"/{instance}",
                       HWVERSION="1.0", INSTANCE=instance, IPTYPE="PERIPHERAL", IS_ENABLE="1",
                       MODCLASS="PERIPHERAL", MODTYPE=vlnv.split(":")[2], VLNV=vlnv)
    docs = ET.SubElement(ip, "DOCUMENTS")
    del docs
    params = ET.SubElement(ip, "PARAMETERS")
    for name, value in (("C_S_AXI_CONTROL_BASEADDR", f"0x{control_base:08X}"),
                        ("C_S_AXI_CONTROL_HIGHADDR", f"0x{high:08X}"),
                        ("C_S_AXI_CONTROL_ADDR_WIDTH", str(regmap.addr_width)),
                        ("C_S_AXI_CONTROL_DATA_WIDTH", "32"),
                        *((name, str(value)) for name, value in IpParameters(
                            gmem_data_width=bus_width, max_feat_dim=max_feat_dim,
                            mac_max_depth=mac_max_depth,
                            # the training Pipeline's limits (0: no Pipeline)
                            **{f"pipe_{k}": (pipeline or {}).get(k, 0)
                               for k in IpParameters.PIPELINE_LIMITS}).hwh_items())):
        ET.SubElement(params, "PARAMETER", NAME=name, VALUE=value)
    abs_ = ET.SubElement(ip, "ADDRESSBLOCKS")
    block = ET.SubElement(abs_, "ADDRESSBLOCK", ACCESS="read-write", INTERFACE="s_axi_control",
                          NAME="Reg", RANGE=str(regmap.size), USAGE="register")
    block.append(regmap.to_hwh_element())
    mm = ET.SubElement(ip, "MEMORYMAP")
    ET.SubElement(mm, "MEMRANGE", ADDRESSBLOCK="HP0_DDR_LOW", BASENAME="C_BASEADDR",
                  BASEVALUE=f"0x{mem_base:08X}", HIGHNAME="C_HIGHADDR",
                  HIGHVALUE=f"0x{mem_base + mem_size - 1:08X}", INSTANCE="zynq_ultra_ps_e_0",
                  IS_DATA="TRUE", IS_INSTRUCTION="TRUE", MASTERBUSINTERFACE="m_axi_gmem",
                  MEMTYPE="MEMORY", SLAVEBUSINTERFACE="S_AXI_HP0_FPD")
    ports = ET.SubElement(ip, "PORTS")
    ET.SubElement(ports, "PORT", DIR="I", NAME="ap_clk", SIGIS="clk")
    ET.SubElement(ports, "PORT", DIR="I", NAME="ap_rst_n", SIGIS="rst")
    ET.SubElement(ports, "PORT", DIR="O", NAME="interrupt", SIGIS="INTERRUPT")
    bifs = ET.SubElement(ip, "BUSINTERFACES")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="ps_M_AXI_HPM0_FPD", DATAWIDTH="32",
                  NAME="s_axi_control", TYPE="SLAVE", VLNV="xilinx.com:interface:aximm:1.0")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="gmem_S_AXI_HP0_FPD", DATAWIDTH="128",
                  NAME="m_axi_gmem", TYPE="MASTER", VLNV="xilinx.com:interface:aximm:1.0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8" standalone="no" ?>\n' + \
        ET.tostring(root, encoding="unicode") + "\n"


def write_overlay(out_dir, config: str = "small", name: str = "gnnweave_sim", **kw) -> Path:
    """Write ``<out_dir>/<name>.hwh`` and a dummy ``<name>.bit``; returns the .bit path
    (what ``pynq.Overlay`` takes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from gnnweave.hw.configs import get_config, get_mac_config, get_pipeline_config
    cfg = get_config(config)
    mac = get_mac_config(config)
    pipe = get_pipeline_config(config)
    if pipe is not None:
        kw.setdefault("pipeline", {k: getattr(pipe, k) for k in IpParameters.PIPELINE_LIMITS})
    kw.setdefault("max_feat_dim", cfg.max_feat_dim)
    kw.setdefault("mac_max_depth", mac.max_depth if mac is not None else 0)
    kw.setdefault("bus_width", cfg.bus_width)
    (out_dir / f"{name}.hwh").write_text(hwh_text(regmap(config), **kw))
    bit = out_dir / f"{name}.bit"
    # never programmed: the simulated device ignores it (and a real board would refuse it)
    bit.write_bytes(b"gnnweave simulated device: not a bitstream\n")
    return bit

