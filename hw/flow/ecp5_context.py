"""What an ECP5 place-and-route of one unit needs to see the unit as a board build would.

nextpnr's ``--out-of-context`` mode (a module with more ports than the part has pins)
turns global promotion off: the clock of every flip-flop is then routed over general
wiring, like any net. :func:`port_wrapper` instead puts the module inside a wrapper with
three pins (clock, serial in, serial out), so nextpnr places it in context and gives the
clock a global network. :func:`promote_control_nets` does what Lattice's own flow does for
high-fanout resets and clock enables and nextpnr-ecp5 does not (it promotes clocks only):
each of the highest-fanout nets that reach flip-flops' LSR or CE pins gets a DCCA, which
nextpnr routes over one of the eight global networks that may carry fabric signals.
:func:`pack_multiplier_registers` moves the flip-flop behind a product into the
multiplier's output register, which Lattice's synthesis does and Yosys does not.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

#: the wrapper's module name
WRAPPER_TOP = "gnnweave_ecp5_wrap"
#: names a module's clock input may have (a unit's ``clk``, the accelerator top's ``ap_clk``)
CLOCK_PORTS = ("clk", "ap_clk")
#: XOR inputs per register of the output tree: one ECP5 LUT4
_TREE_FANIN = 4
#: how nextpnr names a net it routes over a global network (a promoted clock:
#: ``$glbnet$<port>$TRELLIS_IO_IN``, the pin's input buffer then the DCCA)
GLOBAL_NET_PREFIX = "$glbnet$"
#: global networks a DCCA may drive into fabric pins, less the one the clock takes
PROMOTED_NETS = 7
#: the least fanout a promoted net has
PROMOTE_MIN_FANOUT = 64
_PORT_LINE = re.compile(r"^\s*wire (?:width (?P<width>\d+) )?(?P<dir>input|output|inout) "
                        r"(?P<index>\d+)\s+\\(?P<name>\S+)$", re.M)


def module_ports(design: str, module: str) -> list[tuple[str, str, int]]:
    """``(name, direction, width)`` of each port of RTLIL module ``module``, in port order."""
    head = f"module \\{module}\n"
    if head not in design:
        raise ValueError(f"module {module!r} not in the design")
    body = design[design.index(head):]
    body = body[:body.index("\nend\n")]
    ports = sorted((int(m["index"]), m["name"], m["dir"], int(m["width"] or 1))
                   for m in _PORT_LINE.finditer(body))
    return [(name, direction, width) for _, name, direction, width in ports]


@dataclass(frozen=True)
class PortWrapper:
    """A :func:`port_wrapper`: its Verilog, the clock port's name, its own flip-flops."""
    verilog: str
    clock: str
    flip_flops: int


def port_wrapper(design: str, module: str) -> PortWrapper:
    """``module`` inside WRAPPER_TOP: its clock from the wrapper's, every other input from a
    shift register fed by pin ``si``, and every output registered, then XOR-reduced four
    inputs per register, a level per cycle, to pin ``so``.

    The wrapper's own paths are one flip-flop or one LUT4 between flip-flops, so the slowest
    path of the placed design is the module's; nothing of the module is left unloaded."""
    ports = module_ports(design, module)
    clocks = [name for name, direction, _ in ports if direction == "input" and name in CLOCK_PORTS]
    if len(clocks) != 1:
        raise ValueError(f"module {module!r} needs one clock input named "
                         f"{' or '.join(CLOCK_PORTS)}; it has {clocks or 'none'}")
    clock = clocks[0]
    if any(direction == "inout" for _, direction, _ in ports):
        raise ValueError(f"module {module!r} has an inout port: no wrapper for it")
    inputs = [(n, w) for n, d, w in ports if d == "input" and n != clock]
    outputs = [(n, w) for n, d, w in ports if d == "output"]
    n_in, n_out = sum(w for _, w in inputs), sum(w for _, w in outputs)
    if not n_out:
        raise ValueError(f"module {module!r} has no output: nothing would keep its logic")
    lines = [f"module {WRAPPER_TOP}(input {clock}, input si, output so);"]
    connections = [f".{clock}({clock})"]
    if n_in:
        lines += [f"  reg [{n_in - 1}:0] chain;",
                  f"  always @(posedge {clock}) chain <= {{chain, si}};"
                  if n_in > 1 else f"  always @(posedge {clock}) chain <= si;"]
        low = 0
        for name, width in inputs:
            connections.append(f".\\{name} (chain[{low + width - 1}:{low}])")
            low += width
    lines += [f"  wire [{n_out - 1}:0] outs;", f"  reg [{n_out - 1}:0] level0;",
              f"  always @(posedge {clock}) level0 <= outs;"]
    low = 0
    for name, width in outputs:
        connections.append(f".\\{name} (outs[{low + width - 1}:{low}])")
        low += width
    lines.append(f"  \\{module} unit ({', '.join(connections)});")
    tree, tree_flip_flops = _xor_tree(clock, n_out)
    lines += [*tree, "endmodule"]
    return PortWrapper("\n".join(lines) + "\n", clock, n_in + n_out + tree_flip_flops)


def _xor_tree(clock: str, width: int) -> tuple[list[str], int]:
    """Verilog lines that XOR-reduce register ``level0`` (``width`` bits) to ``so``, one LUT4
    per register, a level per cycle; and the flip-flops the levels take."""
    lines, level, flip_flops = [], 0, 0
    while width > 1:
        narrower = -(-width // _TREE_FANIN)
        lines += [f"  reg [{narrower - 1}:0] level{level + 1};",
                  f"  always @(posedge {clock}) begin"]
        for i in range(narrower):
            terms = " ^ ".join(f"level{level}[{j}]"
                               for j in range(i * _TREE_FANIN, min((i + 1) * _TREE_FANIN, width)))
            lines.append(f"    level{level + 1}[{i}] <= {terms};")
        lines.append("  end")
        width, level, flip_flops = narrower, level + 1, flip_flops + narrower
    return lines + [f"  assign so = level{level}[0];"], flip_flops


def promote_control_nets(netlist: Path, top: str = WRAPPER_TOP, count: int = PROMOTED_NETS,
                         min_fanout: int = PROMOTE_MIN_FANOUT) -> list[dict]:
    """Put a DCCA on each of the ``count`` nets of Yosys JSON ``netlist`` (module ``top``) that
    reach the most flip-flop LSR and CE pins (``min_fanout`` or more), in place; only those
    pins move to the DCCA's output, a net's other loads stay on it. Returns ``{net, fanout}``
    of each promoted net, the highest first."""
    doc = json.loads(Path(netlist).read_text())
    module = doc["modules"].get(top)
    if module is None:
        raise ValueError(f"{netlist}: no module {top!r}")
    cells, netnames = module.setdefault("cells", {}), module.setdefault("netnames", {})
    control = [(cell, pin) for cell in cells.values() if cell["type"] == "TRELLIS_FF"
               for pin in ("LSR", "CE") if _one_bit(cell, pin) is not None]
    fanout = Counter(_one_bit(cell, pin) for cell, pin in control)
    names = _net_names(netnames)
    next_bit = 1 + max((b for net in netnames.values() for b in net["bits"] if isinstance(b, int)),
                       default=1)
    promoted = []
    for k, (bit, loads) in enumerate(fanout.most_common(count)):
        if loads < min_fanout:
            break
        glb, next_bit = next_bit, next_bit + 1
        for cell, pin in control:
            if cell["connections"][pin] == [bit]:
                cell["connections"][pin] = [glb]
        cells[f"$promoted{k}"] = {
            "hide_name": 1, "type": "DCCA", "parameters": {}, "attributes": {},
            "port_directions": {"CLKI": "input", "CE": "input", "CLKO": "output"},
            "connections": {"CLKI": [bit], "CE": ["1"], "CLKO": [glb]}}
        netnames[f"$promoted{k}"] = {"hide_name": 1, "bits": [glb], "attributes": {}}
        promoted.append({"net": names.get(bit, str(bit)), "fanout": loads})
    Path(netlist).write_text(json.dumps(doc))
    return promoted


def _net_names(netnames: dict) -> dict:
    """``{bit: name}``, a visible name where the bit has one."""
    names = {}
    for name, net in sorted(netnames.items(), key=lambda item: item[1].get("hide_name", 0)):
        for bit in net["bits"]:
            names.setdefault(bit, name)
    return names


def unpromote_net(netlist: Path, net: str, top: str = WRAPPER_TOP) -> str:
    """Undo :func:`promote_control_nets` for the net named ``net`` (any name of a promoted
    DCCA's input), in place: its pins go back to the net and the DCCA goes. nextpnr may
    fail to route a net from where its driver lies to the DCCA's input; without the DCCA it
    is routed like any net. Returns the name :func:`promote_control_nets` gave the net."""
    doc = json.loads(Path(netlist).read_text())
    module = doc["modules"][top]
    cells, netnames = module["cells"], module["netnames"]
    bits = netnames.get(net, {}).get("bits", [])
    if not bits and (one := re.fullmatch(r"(?P<name>.+)\[(?P<index>\d+)\]", net)):
        # nextpnr names a bit of a wider net by its index
        wide = netnames.get(one["name"], {}).get("bits", [])
        bits = wide[int(one["index"]):int(one["index"]) + 1]
    found = [(name, c) for name, c in cells.items()
             if c["type"] == "DCCA" and name.startswith("$promoted")
             and c["connections"]["CLKI"][0] in bits]
    if not found:
        raise ValueError(f"{netlist}: no promoted net named {net!r}")
    name, dcca = found[0]
    bit, glb = dcca["connections"]["CLKI"], dcca["connections"]["CLKO"]
    for cell in cells.values():
        for pin in ("LSR", "CE"):
            if cell["connections"].get(pin) == glb:
                cell["connections"][pin] = bit
    del cells[name]
    netnames.pop(name, None)
    Path(netlist).write_text(json.dumps(doc))
    return _net_names(netnames).get(bit[0], str(bit[0]))


def pack_multiplier_registers(netlist: Path, top: str = WRAPPER_TOP) -> int:
    """Move the flip-flops behind each MULT18X18D into its output register, in place, as
    Lattice's synthesis does and Yosys' ``synth_ecp5`` does not (it maps every multiplier
    without registers). A multiplier qualifies when every product bit that anything reads
    has one load, the data input of a flip-flop without reset that starts at 0, and those
    flip-flops share one clock and one clock enable (or none); its ``REG_OUTPUT`` then
    takes them (clock ``CLK0``, enable ``CE0``) and the flip-flops go. Returns the
    multipliers packed."""
    doc = json.loads(Path(netlist).read_text())
    module = doc["modules"].get(top)
    if module is None:
        raise ValueError(f"{netlist}: no module {top!r}")
    cells = module.setdefault("cells", {})
    loads: dict = {}
    for name, cell in cells.items():
        for pin, bits in cell["connections"].items():
            if cell["port_directions"].get(pin) == "input":
                for bit in bits:
                    loads.setdefault(bit, []).append((name, pin))
    ports = {b for port in module.get("ports", {}).values() for b in port["bits"]}
    packed = 0
    for mult in [c for c in cells.values() if c["type"] == "MULT18X18D"]:
        group = _product_flip_flops(mult, cells, loads, ports)
        if group is None:
            continue
        flops, (clock, enable) = group
        for pin, name in flops.items():
            mult["connections"][pin] = cells.pop(name)["connections"]["Q"]
        mult["parameters"].update(REG_OUTPUT_CLK="CLK0", REG_OUTPUT_CE="CE0",
                                  REG_OUTPUT_RST="RST0", GSR="DISABLED")
        mult["connections"].update(CLK0=list(clock), CE0=list(enable), RST0=["0"])
        mult["port_directions"].update(CLK0="input", CE0="input", RST0="input")
        packed += 1
    Path(netlist).write_text(json.dumps(doc))
    return packed


def _product_flip_flops(mult: dict, cells: dict, loads: dict, ports: set):
    """``({P pin: flip-flop}, (clock, enable))`` when every used product bit of ``mult``
    feeds exactly one packable flip-flop (see :func:`pack_multiplier_registers`), else
    None."""
    flops, key = {}, None
    for pin in (f"P{i}" for i in range(36)):
        bit = _one_bit(mult, pin)
        if bit is None or (bit not in loads and bit not in ports):
            continue                        # a bit nothing reads
        if bit in ports or len(loads[bit]) != 1 or loads[bit][0][1] != "DI":
            return None
        name = loads[bit][0][0]
        ff = cells[name]
        params = ff["parameters"]
        if (ff["type"] != "TRELLIS_FF" or params.get("CLKMUX") != "CLK"
                or params.get("REGSET") != "RESET"
                or ff["connections"].get("LSR", ["0"]) != ["0"]
                or params.get("CEMUX", "1").strip() not in ("1", "CE")):
            return None
        enable = tuple(ff["connections"]["CE"]) if params["CEMUX"] == "CE" else ("1",)
        if key is None:
            key = (tuple(ff["connections"]["CLK"]), enable)
        elif key != (tuple(ff["connections"]["CLK"]), enable):
            return None
        flops[pin] = name
    return (flops, key) if flops else None


def _one_bit(cell: dict, pin: str):
    """The net bit on ``pin`` of ``cell`` if it is one non-constant bit, else None."""
    bits = cell["connections"].get(pin)
    return bits[0] if bits and len(bits) == 1 and isinstance(bits[0], int) else None
