"""Analytic budget of a build: block RAM, UltraRAM and DSP48 per unit, without synthesis.

The build is elaborated (Amaranth only: no RTLIL, no Yosys) and every memory and every
multiply of its fragments is mapped by the rules below, the ones Yosys ``synth_xilinx``
applies (``memory_libmap`` with the Xilinx libraries ``brams_xc4v.txt``, ``urams.txt`` and
``lutrams_xcu.txt``; ``mul2dsp`` with the family's DSP tile). The budget follows the
memories as built, whatever shapes the units give them.

Memories (``W`` bits x ``D`` words, one write port, read ports as built)
-----------------------------------------------------------------------
memory_libmap gives every candidate mapping a cost and takes the cheapest; a
``ram_style`` attribute (``block``, ``ultra``/``huge``, ``distributed``, ``logic``)
forces the kind. Costs per primitive (from the Yosys libraries): RAMB18 129, RAMB36 257,
URAM288 1024, a LUT RAM 16 (scaled by the share of its width used).

- **block RAM** (synchronous read only): the cheapest tiling over the simple-dual-port
  shapes RAMB18 ``16384x1 .. 2048x9, 1024x18, 512x36`` and RAMB36 ``32768x1 .. 1024x36,
  512x72`` (``ceil(D / d) * ceil(W / w)`` primitives); one extra read port doubles it.
  A RAMB18 counts half a BRAM36.
- **UltraRAM** (UltraScale+ parts with URAM: ``synth_xilinx -uram``, or forced):
  ``4096 x 72`` per URAM288, ``ceil(D / 4096) * ceil(W / 72)``. At cost 1024 against 257 a
  URAM wins only for memories at least about 4x deeper than they are wide in 72-bit
  columns (e.g. ``W <= 72, D = 4096``); wide shallow memories stay in block RAM unless
  marked ``ram_style = "ultra"``.
- **LUT RAM** (also for asynchronous reads): ``64 x 7`` (RAM64M8) or ``32 x 14``
  (RAM32M16) per 8 LUTs, deeper memories in ``ceil(D / 64)`` banks. Memories up to 64 words
  always land here (a LUT RAM costs less than any block RAM tiling of them).
- Memories of 4 words or fewer, or that no block fits, become flip-flops (not counted here).

Multiplies (``a x b`` bits, a non-constant product)
----------------------------------------------------
DSP48E2 (UltraScale+): a signed ``27 x 18`` multiplier, so an unsigned operand needs one
more bit; a product whose operands fit is one DSP, a larger one ``ceil(a' / 26) *
ceil(b' / 17)`` DSPs (mul2dsp's partial products, the better of both orientations, with
``a' >= b'``). DSP48E1 (7-series): ``25 x 18``, ``ceil(a' / 24) * ceil(b' / 17)``.
Products with an operand of one bit, or by a constant, are left to the fabric (Yosys turns
them into logic or shifts), so they count no DSP.

What it cannot tell: LUT and flip-flop counts (run the Yosys estimate), memories Yosys
merges or removes (an unread memory is removed: the budget still counts it), and the DSPs
Yosys packs adders into (never more DSPs than counted here).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

#: memory_libmap costs (Yosys techlibs/xilinx: brams_xc4v.txt, urams.txt, lutrams_xcu.txt)
COST = {"bram18": 129, "bram36": 257, "uram": 1024, "lutram": 16}
#: simple-dual-port shapes (depth, width)
BRAM18_SHAPES = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36))
BRAM36_SHAPES = ((32768, 1), (16384, 2), (8192, 4), (4096, 9), (2048, 18), (1024, 36), (512, 72))
URAM_SHAPE = (4096, 72)
LUTRAM_SHAPES = ((32, 14), (64, 7))
#: depth up to which a memory becomes flip-flops
FF_MAX_DEPTH = 4
DSP_TILE = {"xcup": (27, 18), "xc7": (25, 18)}
RESOURCES = ("bram36", "uram", "dsp")


@dataclass(frozen=True)
class MemorySpec:
    """One memory as built: ``width`` bits x ``depth`` words."""

    name: str
    width: int
    depth: int
    sync_reads: int = 1
    async_reads: int = 0
    style: str | None = None        # ram_style attribute, lower case


@dataclass(frozen=True)
class MultiplySpec:
    """One non-constant product of an ``a_width`` and a ``b_width`` operand."""

    name: str
    a_width: int
    b_width: int
    a_signed: bool = True
    b_signed: bool = True


def map_memory(mem: MemorySpec, *, uram: bool = True) -> dict:
    """``{"kind", "bram36", "uram", "primitives", "cost"}`` of one memory (see the module
    docstring); ``uram``: the part has UltraRAM and Yosys may pick it by cost."""
    W, D = mem.width, mem.depth
    copies = max(mem.sync_reads + mem.async_reads, 1)
    style = (mem.style or "").lower()
    if W == 0 or D == 0:
        return _mapping("none", 0, 0, "", 0)
    if style in ("logic", "registers") or (D <= FF_MAX_DEPTH and not style):
        return _mapping("ff", 0, 0, f"{W * D} FF bits", 0)
    lut = min(math.ceil(D / d) * W / w * COST["lutram"] for d, w in LUTRAM_SHAPES) * copies
    lut_mapping = _mapping("lutram", 0, 0, "LUT RAM", lut)
    if mem.async_reads or style == "distributed" or (D <= 64 and style not in ("block", "ultra", "huge")):
        return lut_mapping
    options = []
    if style in ("", "block", "block_ram"):
        for kind, shapes in (("bram18", BRAM18_SHAPES), ("bram36", BRAM36_SHAPES)):
            for d, w in shapes:
                n = math.ceil(D / d) * math.ceil(W / w) * copies
                options.append(_mapping("bram", n * (0.5 if kind == "bram18" else 1.0), 0,
                                        f"{n} x {kind.upper()} {d}x{w}", n * COST[kind]))
    if style in ("ultra", "huge") or (uram and not style):
        d, w = URAM_SHAPE
        n = math.ceil(D / d) * math.ceil(W / w) * copies
        options.append(_mapping("uram", 0, n, f"{n} x URAM288 {d}x{w}", n * COST["uram"]))
    if not style:
        options.append(lut_mapping)
    return min(options, key=lambda o: (o["cost"], o["bram36"]))


def _mapping(kind, bram36, uram, primitives, cost) -> dict:
    return {"kind": kind, "bram36": bram36, "uram": uram, "primitives": primitives, "cost": cost}


def dsp_count(mul: MultiplySpec, family: str = "xcup") -> int:
    """DSP48s of one product (see the module docstring)."""
    ta, tb = DSP_TILE[family]
    a = mul.a_width + (0 if mul.a_signed else 1)
    b = mul.b_width + (0 if mul.b_signed else 1)
    if min(mul.a_width, mul.b_width) <= 1:
        return 0
    a, b = max(a, b), min(a, b)
    if a <= ta and b <= tb:
        return 1
    return min(math.ceil(a / (ta - 1)) * math.ceil(b / (tb - 1)),
               math.ceil(b / (ta - 1)) * math.ceil(a / (tb - 1)))


# --------------------------------------------------------------------------------------------
# inventory of an elaborated design
# --------------------------------------------------------------------------------------------


def inventory(component, *, unit_depth: int = 1) -> dict:
    """``{unit: {"memories": [MemorySpec], "multiplies": [MultiplySpec]}}`` of a component:
    units are its submodules (as in the Yosys estimate), ``(own)`` its own logic."""
    from amaranth.hdl import Fragment
    frag = Fragment.get(component, None)
    units: dict = {}

    def unit_of(path):
        return "/".join(path[:unit_depth]) if path else "(own)"

    def walk(f, path):
        from amaranth.hdl._mem import MemoryInstance
        for sub, name, _ in f.subfragments:
            sub_path = path + [str(name)]
            if isinstance(sub, MemoryInstance):
                units.setdefault(unit_of(path), _empty())["memories"].append(
                    _memory_spec(sub, ".".join(sub_path)))
            else:
                walk(sub, sub_path)
        muls = _multiplies(f, ".".join(path) or "(own)")
        if muls:
            units.setdefault(unit_of(path), _empty())["multiplies"].extend(muls)

    walk(frag, [])
    return units


def _empty() -> dict:
    return {"memories": [], "multiplies": []}


def _memory_spec(inst, name: str) -> MemorySpec:
    from amaranth.hdl import Shape
    data = inst._data
    width = Shape.cast(data.shape).width
    sync = sum(1 for p in inst._read_ports if p._domain != "comb")
    comb = sum(1 for p in inst._read_ports if p._domain == "comb")
    attrs = dict(getattr(inst, "_attrs", None) or getattr(data, "_attrs", None) or {})
    style = next((str(attrs[k]).lower() for k in ("ram_style", "ram_block", "ramstyle",
                                                 "syn_ramstyle") if k in attrs), None)
    return MemorySpec(name, width, data.depth, sync_reads=sync, async_reads=comb, style=style)


def _multiplies(frag, where: str) -> list[MultiplySpec]:
    """Every non-constant ``*`` in the fragment's statements (shared subexpressions once)."""
    from amaranth.hdl._ast import Const, Operator, Value
    found, seen = [], set()

    def visit(node):
        stack = [node]
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if isinstance(x, Operator) and x.operator == "*" and len(x.operands) == 2:
                a, b = x.operands
                if not isinstance(a, Const) and not isinstance(b, Const):
                    sa, sb = a.shape(), b.shape()
                    found.append(MultiplySpec(where, sa.width, sb.width, sa.signed, sb.signed))
            stack.extend(_children(x, Value))

    for stmts in frag.statements.values():
        for s in stmts:
            visit(s)
    return found


#: type -> whether it is a Value or Statement (isinstance on Amaranth's ABCs is slow, and
#: the walk asks once per attribute of every node)
_NODE_TYPES: dict = {}


def _is_node(v, Value) -> bool:
    t = type(v)
    known = _NODE_TYPES.get(t)
    if known is None:
        from amaranth.hdl._ast import Statement
        known = _NODE_TYPES[t] = issubclass(t, (Value, Statement))
    return known


def _children(x, Value):
    if type(x) in (list, tuple):
        return list(x)
    if not _is_node(x, Value):
        return []
    out = []
    for v in vars(x).values():
        if type(v) in (list, tuple):
            out.extend(item for item in v if type(item) in (list, tuple) or _is_node(item, Value))
        elif _is_node(v, Value):
            out.append(v)
    return out


# --------------------------------------------------------------------------------------------
# budget of a component / a named build on a board
# --------------------------------------------------------------------------------------------


def component_budget(component, *, family: str = "xcup", uram: bool = True) -> dict:
    """``{"units": {unit: {bram36, uram, dsp, memories: [...]}}, "total": {...}}``."""
    return inventory_budget(inventory(component), family=family, uram=uram)


def config_inventory(config_name: str, top: str | None = None) -> dict:
    """:func:`inventory` of a named build, elaborated here (the slow part of a budget)."""
    from .estimate import config_top
    component, _ = config_top(config_name, top)
    return inventory(component)


def inventory_budget(units_inventory: dict, *, family: str = "xcup", uram: bool = True) -> dict:
    """The budget (:func:`component_budget`) of an :func:`inventory`; it is not changed."""
    units = {}
    total = dict.fromkeys(RESOURCES, 0)
    for unit, inv in sorted(units_inventory.items()):
        res = dict.fromkeys(RESOURCES, 0)
        mems = []
        for mem in inv["memories"]:
            mp = map_memory(mem, uram=uram and family == "xcup")
            res["bram36"] += mp["bram36"]
            res["uram"] += mp["uram"]
            if mp["kind"] in ("bram", "uram"):
                mems.append({"name": mem.name, "width": mem.width, "depth": mem.depth,
                             "style": mem.style, "mapped": mp["primitives"]})
        res["dsp"] = sum(dsp_count(mul, family) for mul in inv["multiplies"])
        if any(res.values()) or mems:
            units[unit] = {**res, "memories": mems}
        for k in RESOURCES:
            total[k] += res[k]
    return {"units": units, "total": total}


def budget(config_name: str, board=None, *, top: str | None = None) -> dict:
    """Budget of a named build, checked against ``board`` (default: none, no fit check)."""
    from .boards import get_board
    from .estimate import xilinx_family
    t0 = time.monotonic()
    board = get_board(board) if board is not None else None
    family = xilinx_family(board)
    uram = bool(board.resources.get("uram")) if board is not None else True
    res = inventory_budget(config_inventory(config_name, top), family=family, uram=uram)
    out = {"config": config_name, "family": family, "uram_allowed": uram,
           "method": "analytic: elaborated memories and multiplies mapped by the rules of "
                     "hw/flow/budget.py (no synthesis)", **res}
    if board is not None:
        out["board"] = board.key
        out.update(check_budget(board, res["total"]))
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


#: the share of a board's block RAM, UltraRAM and DSPs a build may take (room for the
#: platform's own logic, Vivado's different mapping choices and placement)
FIT_MARGIN = 0.90


def check_budget(board, total: dict, margin: float = FIT_MARGIN) -> dict:
    """``{"fits": bool, "fits_by_resource": {...}, "utilisation": {...}}``: a resource fits
    when it uses at most ``margin`` of the board's."""
    fits, util = {}, {}
    for kind in RESOURCES:
        cap = board.resources.get(kind)
        if cap is None:
            continue
        used = total.get(kind, 0)
        util[kind] = round(used / cap, 3) if cap else (0.0 if not used else math.inf)
        fits[kind] = used <= margin * cap
    return {"fits": all(fits.values()), "fits_by_resource": fits, "utilisation": util,
            "margin": margin}
