"""AXI4-Lite control slave generated from a :class:`~.regmap.RegisterMap`.

Behaviour (host view) is that of a Vitis HLS ``s_axi_control`` with ``ap_ctrl_hs``; see
:mod:`.regmap` for the layout (offsets and bits from :mod:`gnnweave.contract`). Bus behaviour:

* AW and W are accepted independently, in either order or in the same cycle; the write is
  performed once both are held, then B is raised. One write and one read are outstanding
  at most: AWREADY/WREADY stay low while a write is held or its B is waiting, ARREADY stays
  low while R is waiting. BVALID/RVALID and their payloads are registers that hold until
  BREADY/RREADY, however long that takes.
* WSTRB is honoured per byte for RW registers; the ap_ctrl bits all live in byte 0.
* Mapped offsets answer OKAY (a write to a read-only register is ignored, as in Vitis);
  unmapped offsets answer SLVERR, reads of them return 0 and writes to them are dropped.
  Address bits below the word (AxADDR[1:0]) are ignored.
* Side effects of a read (clear-on-read of ap_done/ap_ready, the 64-bit snapshot) happen
  when AR is accepted.
* Read-only registers wider than 32 bits: reading the low word captures the high word in a
  snapshot register, and reading the high word returns that snapshot, so a host that reads
  low then high (as a 64-bit access split by the interconnect does) gets one consistent
  value. Reading the high word alone returns the value captured at the last low-word read.

Engine handshake (``ap_ctrl_hs``): ``start`` is the level of ``ap_start``. The engine starts
when it sees ``start & idle`` and pulses ``accepted`` (that is ``ap_ready``: it clears
``ap_start`` unless ``auto_restart``, and sets CTRL.ap_ready and ISR.ap_ready if enabled).
When a run finishes it pulses ``done`` (sets the sticky ap_done and ISR.ap_done if enabled).
An event and a clearing read/toggle in the same cycle: the event wins, so none is lost;
a host write of ap_start=1 in the same cycle as ``accepted`` wins too.

Connecting registers to an engine: ``ctrl.rw.<name>`` are outputs of the control (the
register values; the engine reads them) and ``ctrl.ro.<name>`` are inputs of the control
(the engine drives them). With the signatures below, ``connect`` is natural::

    class Engine(wiring.Component):
        def __init__(self, regmap):
            super().__init__({"args": In(rw_signature(regmap)),     # engine reads these
                              "status": Out(ro_signature(regmap)),  # engine drives these
                              ...})
    connect(m, ctrl.rw, engine.args)
    connect(m, engine.status, ctrl.ro)

Both helper signatures give each member the register's ``reset`` as its initial value, so the
members match on both sides; an RO register left undriven reads as its ``reset``.

Clock domains: everything is in ``sync`` unless :attr:`AxiLiteControl.bus_domain` names
another domain for the bus side (see there): the simulated device's build uses that to stop
the register file's clock between register accesses.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.contract import (
    CTRL_OFFSET, DATA_WIDTH, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, WORD_BYTES, CtrlBit, GieBit,
    IrqBit,
)

from .axi import AXI4LiteSignature, Resp
from .regmap import Access, RegisterMap

__all__ = ["AxiLiteControl", "rw_signature", "ro_signature"]


def _check_regmap(regmap) -> RegisterMap:
    if not isinstance(regmap, RegisterMap):
        raise TypeError(f"expected a RegisterMap (from RegisterBuilder.build()), not {regmap!r}")
    return regmap


def rw_signature(regmap: RegisterMap) -> wiring.Signature:
    """``{name: Out(width, init=reset)}`` for every RW register (host writes, engine reads).

    The control has ``rw: Out(rw_signature(...))``; an engine takes ``In(rw_signature(...))``."""
    _check_regmap(regmap)
    return wiring.Signature({r.name: Out(r.width, init=r.reset)
                             for r in regmap if r.access is Access.RW})


def ro_signature(regmap: RegisterMap) -> wiring.Signature:
    """``{name: Out(width, init=reset)}`` for every RO register, from the driver's side.

    An engine takes ``Out(ro_signature(...))``; the control has ``ro: In(ro_signature(...))``."""
    _check_regmap(regmap)
    return wiring.Signature({r.name: Out(r.width, init=r.reset)
                             for r in regmap if r.access is Access.RO})


class AxiLiteControl(wiring.Component):
    """AXI4-Lite control slave with a Vitis ``ap_ctrl_hs`` block and the map's registers.

    Members:

    * ``bus: In(AXI4LiteSignature(addr_width=regmap.addr_width, data_width=32))``
    * ``start: Out(1)``: level of ap_start
    * ``accepted: In(1)``: pulse, the engine took the start (ap_ready)
    * ``done: In(1)``: pulse, a run finished (ap_done)
    * ``idle: In(1)``: level, the engine is idle (ap_idle)
    * ``interrupt: Out(1)``: ``GIE & |ISR``
    * ``rw: Out(rw_signature(regmap))``: RW register values, driven by the control
    * ``ro: In(ro_signature(regmap))``: RO register values, driven by the engine

    ``bus_domain`` (set before elaboration; default ``"sync"``): the domain of the bus side,
    which is every register that changes only while an AXI4-Lite transaction is in flight:
    the channel handshakes, the RW registers, the read response and the 64-bit snapshots,
    GIE, IER and auto_restart. The ap_ctrl bits that engine events set or clear (ap_start,
    ap_done, ap_ready, ISR) stay in ``sync``. With another domain the behaviour is the same
    as long as that domain's clock runs with ``sync``'s on every cycle of a transaction (and
    through reset); between transactions it may stop.
    """

    bus_domain = "sync"

    def __init__(self, regmap: RegisterMap):
        if not isinstance(regmap, RegisterMap):
            self._MustUse__silence = True   # never elaborated: no "unused" warning at exit
        self.regmap = _check_regmap(regmap)
        if regmap.data_width != DATA_WIDTH:
            raise ValueError(f"register map {regmap.name!r}: the control slave needs "
                             f"data_width {DATA_WIDTH}, not {regmap.data_width}")
        super().__init__({
            "bus": In(AXI4LiteSignature(addr_width=regmap.addr_width, data_width=DATA_WIDTH)),
            "start": Out(1),
            "accepted": In(1),
            "done": In(1),
            "idle": In(1),
            "interrupt": Out(1),
            "rw": Out(rw_signature(regmap)),
            "ro": In(ro_signature(regmap)),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        on_bus = self.bus_domain
        word_bits = self.regmap.addr_width - 2

        # ap_ctrl state
        ap_start = Signal(name="ap_start")
        ap_done = Signal(name="ap_done")
        ap_ready = Signal(name="ap_ready")
        auto_restart = Signal(name="auto_restart")
        gie = Signal(name="gie")
        ier = Signal(len(IrqBit), name="ier")
        isr = Signal(len(IrqBit), name="isr")

        # ---- write channel: latch AW and W independently, write when both are held --------
        aw_full = Signal()
        aw_word = Signal(word_bits)
        w_full = Signal()
        w_data = Signal(DATA_WIDTH)
        w_strb = Signal(WORD_BYTES)
        b_valid = Signal()
        b_resp = Signal(2)

        m.d.comb += [
            bus.awready.eq(~aw_full & ~b_valid),
            bus.wready.eq(~w_full & ~b_valid),
            bus.bvalid.eq(b_valid),
            bus.bresp.eq(b_resp),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d[on_bus] += [aw_full.eq(1), aw_word.eq(bus.awaddr[2:])]
        with m.If(bus.wvalid & bus.wready):
            m.d[on_bus] += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]

        write = Signal()          # the held write is performed this cycle
        write_mapped = Signal()
        m.d.comb += write.eq(aw_full & w_full & ~b_valid)
        with m.If(write):
            m.d[on_bus] += [
                aw_full.eq(0), w_full.eq(0), b_valid.eq(1),
                b_resp.eq(Resp.OKAY),
            ]
            with m.If(~write_mapped):
                m.d[on_bus] += b_resp.eq(Resp.SLVERR)
        with m.Elif(b_valid & bus.bready):
            m.d[on_bus] += b_valid.eq(0)

        def write_word(offset: int):
            return write & (aw_word == offset // WORD_BYTES)

        ctrl_write = write_word(CTRL_OFFSET) & w_strb[0]
        isr_write = write_word(ISR_OFFSET) & w_strb[0]

        # ---- read channel: one outstanding read, R held until RREADY ------------------------
        r_valid = Signal()
        r_data = Signal(DATA_WIDTH)
        r_resp = Signal(2)
        m.d.comb += [
            bus.arready.eq(~r_valid),
            bus.rvalid.eq(r_valid),
            bus.rdata.eq(r_data),
            bus.rresp.eq(r_resp),
        ]
        read = Signal()           # AR accepted this cycle
        ar_word = Signal(word_bits)
        read_value = Signal(DATA_WIDTH)
        read_mapped = Signal()
        m.d.comb += [read.eq(bus.arvalid & bus.arready), ar_word.eq(bus.araddr[2:])]
        with m.If(read):
            m.d[on_bus] += [r_valid.eq(1), r_data.eq(read_value),
                            r_resp.eq(Resp.OKAY)]
            with m.If(~read_mapped):
                m.d[on_bus] += r_resp.eq(Resp.SLVERR)
        with m.Elif(r_valid & bus.rready):
            m.d[on_bus] += r_valid.eq(0)

        def read_word(offset: int):
            return read & (ar_word == offset // WORD_BYTES)

        # ---- decode: one case per mapped word, for reads and writes ------------------------
        snapshots = {}
        with m.Switch(ar_word):
            with m.Case(CTRL_OFFSET // WORD_BYTES):
                ctrl_bits = [0] * 8
                ctrl_bits[CtrlBit.AP_START] = ap_start
                ctrl_bits[CtrlBit.AP_DONE] = ap_done
                ctrl_bits[CtrlBit.AP_IDLE] = self.idle
                ctrl_bits[CtrlBit.AP_READY] = ap_ready
                ctrl_bits[CtrlBit.AUTO_RESTART] = auto_restart
                m.d.comb += [read_mapped.eq(1),
                             read_value.eq(Cat(*(Const(b, 1) if isinstance(b, int) else b
                                                 for b in ctrl_bits)))]
            with m.Case(GIE_OFFSET // WORD_BYTES):
                m.d.comb += [read_mapped.eq(1), read_value.eq(gie << GieBit.ENABLE)]
            with m.Case(IER_OFFSET // WORD_BYTES):
                m.d.comb += [read_mapped.eq(1), read_value.eq(ier)]
            with m.Case(ISR_OFFSET // WORD_BYTES):
                m.d.comb += [read_mapped.eq(1), read_value.eq(isr)]
            for offset, (reg, index) in self.regmap.word_map().items():
                lo = index * DATA_WIDTH
                hi = min(lo + DATA_WIDTH, reg.width)
                with m.Case(offset // WORD_BYTES):
                    m.d.comb += read_mapped.eq(1)
                    if reg.access is Access.RW:
                        m.d.comb += read_value.eq(getattr(self.rw, reg.name)[lo:hi])
                    elif reg.words == 1:
                        m.d.comb += read_value.eq(getattr(self.ro, reg.name))
                    elif index == 0:
                        value = getattr(self.ro, reg.name)
                        snapshot = Signal(reg.width - DATA_WIDTH, name=f"{reg.name}_hi_snapshot")
                        snapshots[reg.name] = snapshot
                        m.d.comb += read_value.eq(value[:DATA_WIDTH])
                        with m.If(read):
                            m.d[on_bus] += snapshot.eq(value[DATA_WIDTH:])
                    else:
                        m.d.comb += read_value.eq(snapshots[reg.name])

        mapped_words = [CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET,
                        *self.regmap.word_map()]
        with m.Switch(aw_word):
            for offset in mapped_words:
                with m.Case(offset // WORD_BYTES):
                    m.d.comb += write_mapped.eq(1)

        # RW registers: byte-wise writes under WSTRB; the rw port signals are the registers.
        for offset, (reg, index) in self.regmap.word_map().items():
            if reg.access is not Access.RW:
                continue
            storage = getattr(self.rw, reg.name)
            with m.If(write_word(offset)):
                for byte in range(WORD_BYTES):
                    lo = index * DATA_WIDTH + 8 * byte
                    hi = min(lo + 8, reg.width)
                    if lo >= reg.width:
                        break
                    with m.If(w_strb[byte]):
                        m.d[on_bus] += storage[lo:hi].eq(w_data[8 * byte:8 * byte + hi - lo])

        # ---- ap_ctrl_hs --------------------------------------------------------------------
        with m.If(ctrl_write & w_data[CtrlBit.AP_START]):
            m.d.sync += ap_start.eq(1)
        with m.Elif(self.accepted):
            m.d.sync += ap_start.eq(auto_restart)
        with m.If(ctrl_write):
            m.d[on_bus] += auto_restart.eq(w_data[CtrlBit.AUTO_RESTART])

        with m.If(self.done):
            m.d.sync += ap_done.eq(1)
        with m.Elif(read_word(CTRL_OFFSET)):
            m.d.sync += ap_done.eq(0)
        with m.If(self.accepted):
            m.d.sync += ap_ready.eq(1)
        with m.Elif(read_word(CTRL_OFFSET)):
            m.d.sync += ap_ready.eq(0)

        with m.If(write_word(GIE_OFFSET) & w_strb[0]):
            m.d[on_bus] += gie.eq(w_data[GieBit.ENABLE])
        with m.If(write_word(IER_OFFSET) & w_strb[0]):
            m.d[on_bus] += ier.eq(w_data[:len(IrqBit)])
        for bit, event in ((IrqBit.AP_DONE, self.done), (IrqBit.AP_READY, self.accepted)):
            with m.If(ier[bit] & event):
                m.d.sync += isr[bit].eq(1)
            with m.Elif(isr_write):
                m.d.sync += isr[bit].eq(isr[bit] ^ w_data[bit])

        m.d.comb += [
            self.start.eq(ap_start),
            self.interrupt.eq(gie & isr.any()),
        ]
        return m
