"""AXI4-Lite control slave generated from a :class:`~.regmap.RegisterMap`.

Behaviour (host view) is that of a Vitis HLS ``s_axi_control`` with ``ap_ctrl_hs``; see
:mod:`.regmap` for the layout (offsets and bits from :mod:`gnnweave.contract`). Bus behaviour:

* AW and W are accepted independently, in either order or in the same cycle. At the edge
  after both are held the address is decoded into one-hot word selects and a write strobe
  rises, both registers, so every write enable is an AND of flip-flops; the write is
  performed in the strobe's cycle, then B is raised. One write and one read are
  outstanding at most: AWREADY/WREADY stay low while a write is held or its B is waiting,
  ARREADY stays low while a read is in flight. BVALID/RVALID and their payloads are
  registers that hold until BREADY/RREADY, however long that takes.
* Reads: the address is registered at the AR handshake and decoded at the next edge (the
  words whose reads have side effects, one-hot, and "mapped"); at the edge after that the
  read samples its word into the first stage of the read multiplexer (groups of 16 words,
  by the low address bits), and at the next the second stage (the group, by the high
  bits) drives R. Both stages are AND-OR multiplexers with registered one-hot selects (two
  LUT levels each), so no path of the slave crosses the whole address space in one cycle; the price is three cycles more read latency and
  one more write latency than a combinational slave (``read_latency``,
  ``read_sample_delay``, ``write_delay``), which AXI4-Lite allows.
* WSTRB is honoured per byte for RW registers; the ap_ctrl bits all live in byte 0.
* Mapped offsets answer OKAY (a write to a read-only register is ignored, as in Vitis);
  unmapped offsets answer SLVERR, reads of them return 0 and writes to them are dropped.
  Address bits below the word (AxADDR[1:0]) are ignored.
* Side effects of a read (clear-on-read of ap_done/ap_ready, the 64-bit snapshot) happen
  in the cycle the read samples its word, so the value returned is the one just before
  them.
* Read-only registers wider than 32 bits: reading the low word captures the high word in a
  snapshot register, and reading the high word returns that snapshot, so a host that reads
  low then high (as a 64-bit access split by the interconnect does) gets one consistent
  value. Reading the high word alone returns the value captured at the last low-word read.

Engine handshake (``ap_ctrl_hs``): ``start`` is the level of ``ap_start``. The engine starts
when it sees ``start & idle`` and pulses ``accepted`` (that is ``ap_ready``: it clears
``ap_start`` unless ``auto_restart``, and sets CTRL.ap_ready and ISR.ap_ready if enabled).
When a run finishes it pulses ``done`` (sets the sticky ap_done and ISR.ap_done if enabled).
An event and a clearing read (in its sample cycle) or toggle in the same cycle: the event
wins, so none is lost; a host write of ap_start=1 in the same cycle as ``accepted`` wins too.

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

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
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


def _padded(value) -> Value:
    """``value`` zero-extended to a data word."""
    value = Value.cast(value)
    return Cat(value, Const(0, DATA_WIDTH - len(value))) if len(value) < DATA_WIDTH else value


def _one_hot_mux(select: Value, choices) -> Value:
    """The OR of each ``value`` of ``choices`` (``(index, value)`` pairs) whose bit
    ``select[index]`` is set: a multiplexer with a one-hot select (0 with none set)."""
    terms = [_padded(value) & select[index].replicate(DATA_WIDTH) for index, value in choices]
    return _or_tree(terms) if terms else Const(0, DATA_WIDTH)


def _or_tree(terms: list) -> Value:
    while len(terms) > 1:
        terms = [a | b for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) & ~1:]
    return terms[0]


def _word_mask(words, word_bits: int) -> Const:
    """A constant with bit ``w`` set for each word address ``w`` in ``words``: indexed by an
    address it is the "mapped" flag, one small lookup table in the netlist."""
    return Const(sum(1 << w for w in words), 1 << word_bits)


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
    the channel handshakes, the write decode, the RW registers, the read multiplexer's
    stages, the read response and the 64-bit snapshots, GIE, IER and auto_restart. The ap_ctrl bits that engine events set or clear (ap_start,
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

    #: Timing, in cycles after the cycle of the AR handshake: the address is registered at
    #: the handshake and decoded at the next edge, the read samples its word (and has its
    #: side effects) in cycle ``read_sample_delay``, the read multiplexer's second stage
    #: drives R, RVALID is high from cycle ``read_latency`` on.
    read_sample_delay = 2
    read_latency = 4
    #: In cycles after the cycle in which AW and W are both held: the address is decoded
    #: and the write strobe rises at the next edge, the write happens in cycle
    #: ``write_delay``, BVALID is high from the cycle after it.
    write_delay = 2

    def elaborate(self, platform):
        m = Module()
        ap = {name: Signal(name=name) for name in
              ("ap_start", "ap_done", "ap_ready", "auto_restart", "gie")}
        ap["ier"] = Signal(len(IrqBit), name="ier")
        ap["isr"] = Signal(len(IrqBit), name="isr")
        words, snapshots = self._read_values(ap)
        write_word, w_data = self._write_channel(m, [w * WORD_BYTES for w in words])
        strobed = [CTRL_OFFSET, *(self.regmap[name].offset for name in snapshots)]
        read_word = self._read_channel(m, words, strobed)
        self._snapshots(m, read_word, snapshots)
        self._rw_registers(m, write_word, w_data)
        self._ap_ctrl(m, ap, write_word, w_data, read_word)
        return m

    # ---- what each mapped word reads -------------------------------------------------------

    def _read_values(self, ap):
        """``{word index: value a read returns}`` for every mapped word, in offset order, and
        ``{register name: snapshot}``: the high word of a wide RO register reads its
        snapshot (:meth:`_snapshots`)."""
        ctrl_bits = [Const(0, 1)] * 8
        ctrl_bits[CtrlBit.AP_START] = ap["ap_start"]
        ctrl_bits[CtrlBit.AP_DONE] = ap["ap_done"]
        ctrl_bits[CtrlBit.AP_IDLE] = self.idle
        ctrl_bits[CtrlBit.AP_READY] = ap["ap_ready"]
        ctrl_bits[CtrlBit.AUTO_RESTART] = ap["auto_restart"]
        words = {CTRL_OFFSET: Cat(*ctrl_bits), GIE_OFFSET: ap["gie"] << GieBit.ENABLE,
                 IER_OFFSET: ap["ier"], ISR_OFFSET: ap["isr"]}
        snapshots = {}
        for offset, (reg, index) in self.regmap.word_map().items():
            lo, hi = index * DATA_WIDTH, min((index + 1) * DATA_WIDTH, reg.width)
            if reg.access is Access.RW:
                words[offset] = getattr(self.rw, reg.name)[lo:hi]
            elif reg.words == 1 or index == 0:
                words[offset] = getattr(self.ro, reg.name)[lo:hi]
            else:
                snapshot = Signal(reg.width - DATA_WIDTH, name=f"{reg.name}_hi_snapshot")
                snapshots[reg.name] = snapshot
                words[offset] = snapshot
        return {offset // WORD_BYTES: value for offset, value in sorted(words.items())}, snapshots

    # ---- write channel: AW and W latched independently, AW decoded, then the write ---------

    def _write_channel(self, m, mapped_words):
        """AW and W handshakes, the registered decode and B. Returns ``write_word(offset,
        byte)`` (that byte of that word is written this cycle) and the held write data."""
        bus, on_bus = self.bus, self.bus_domain
        aw_full = Signal()
        aw_word = Signal(self.regmap.addr_width - 2)
        aw_select = Signal(len(mapped_words))     # one-hot over the mapped words
        aw_mapped = Signal()
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
        # the held address decoded into one-hot word selects, registered
        m.d[on_bus] += [aw_select[i].eq(aw_word == offset // WORD_BYTES)
                        for i, offset in enumerate(mapped_words)]
        m.d[on_bus] += aw_mapped.eq(_word_mask([o // WORD_BYTES for o in mapped_words],
                                               len(aw_word)).bit_select(aw_word, 1))

        # the write strobe is a register too: it rises the edge after AW and W are both held
        # (with the decode of the address), so a write enable is an AND of flip-flops
        write = Signal()          # the held write is performed this cycle
        m.d[on_bus] += write.eq(aw_full & w_full & ~write)
        with m.If(write):
            m.d[on_bus] += [aw_full.eq(0), w_full.eq(0), b_valid.eq(1),
                            b_resp.eq(Mux(aw_mapped, int(Resp.OKAY), int(Resp.SLVERR)))]
        with m.Elif(b_valid & bus.bready):
            m.d[on_bus] += b_valid.eq(0)

        index = {offset: i for i, offset in enumerate(mapped_words)}

        def write_word(offset: int, *, byte: int):
            return write & aw_select[index[offset]] & w_strb[byte]
        return write_word, w_data

    # ---- read channel: address registered, then a two-stage read multiplexer ---------------

    #: word-address bits the first read stage selects with: 16 words per group, so each
    #: stage is an AND-OR of at most 16 terms (two LUT6 levels)
    GROUP_BITS = 4

    def _read_channel(self, m, words, strobed):
        """AR, the registered read multiplexer and R. Returns ``{offset: strobe}`` for each
        offset of ``strobed``: high in the cycle a read of that word samples it (its side
        effects happen then)."""
        bus, on_bus = self.bus, self.bus_domain
        word_bits = self.regmap.addr_width - 2
        group_bits = max(1, min(self.GROUP_BITS, word_bits - 1))
        ar_held = Signal()        # ar_word holds an accepted address, not yet decoded
        ar_word = Signal(word_bits)
        sample = Signal()         # the read samples its word this cycle
        staged = Signal()         # the first stage holds the sampled read
        r_valid = Signal()
        r_data = Signal(DATA_WIDTH)
        r_resp = Signal(2)
        m.d.comb += [
            bus.arready.eq(~ar_held & ~sample & ~staged & ~r_valid),
            bus.rvalid.eq(r_valid),
            bus.rdata.eq(r_data),
            bus.rresp.eq(r_resp),
        ]
        m.d[on_bus] += [sample.eq(ar_held), staged.eq(sample)]
        with m.If(bus.arvalid & bus.arready):
            m.d[on_bus] += [ar_held.eq(1), ar_word.eq(bus.araddr[2:])]
        with m.Elif(ar_held):
            m.d[on_bus] += ar_held.eq(0)

        # decode: the words whose reads have side effects, "mapped", and the two multiplexer
        # selects, all one-hot (an AND-OR multiplexer is two LUT levels for 16 inputs and
        # leaves the synthesiser no address decode to share across the stages)
        group_size = 1 << group_bits
        groups = sorted({word >> group_bits for word in words})
        selected = {offset: Signal(name=f"read_sel_{offset:x}") for offset in strobed}
        mapped = Signal()
        low_select = Signal(group_size)
        group_select = Signal(len(groups))
        with m.If(ar_held):
            m.d[on_bus] += [sel.eq(ar_word == offset // WORD_BYTES)
                            for offset, sel in selected.items()]
            m.d[on_bus] += [
                mapped.eq(_word_mask(words, word_bits).bit_select(ar_word, 1)),
                low_select.eq(1 << ar_word[:group_bits]),
                group_select.eq(Cat(ar_word[group_bits:] == g for g in groups)),
            ]

        # first stage: each group of 2**group_bits words by the low address bits (unmapped
        # words read 0)
        group_value = [Signal(DATA_WIDTH, name=f"read_group_{g}") for g in groups]
        for value, g in zip(group_value, groups):
            members = [(low, words[g * group_size + low]) for low in range(group_size)
                       if g * group_size + low in words]
            with m.If(sample):
                m.d[on_bus] += value.eq(_one_hot_mux(low_select, members))

        # second stage: the group, by the high address bits; R holds until RREADY
        with m.If(staged):
            m.d[on_bus] += [r_valid.eq(1),
                            r_resp.eq(Mux(mapped, int(Resp.OKAY), int(Resp.SLVERR))),
                            r_data.eq(_one_hot_mux(group_select, enumerate(group_value)))]
        with m.Elif(r_valid & bus.rready):
            m.d[on_bus] += r_valid.eq(0)
        return {offset: sample & sel for offset, sel in selected.items()}

    def _snapshots(self, m, read_word, snapshots):
        """A read of a wide RO register's low word captures its high word."""
        for reg in self.regmap:
            if reg.name in snapshots:
                with m.If(read_word[reg.offset]):
                    m.d[self.bus_domain] += snapshots[reg.name].eq(
                        getattr(self.ro, reg.name)[DATA_WIDTH:])

    # ---- registers -------------------------------------------------------------------------

    def _rw_registers(self, m, write_word, w_data):
        """Byte-wise writes under WSTRB; the ``rw`` port signals are the registers."""
        for offset, (reg, index) in self.regmap.word_map().items():
            if reg.access is not Access.RW:
                continue
            storage = getattr(self.rw, reg.name)
            for byte in range(WORD_BYTES):
                lo = index * DATA_WIDTH + 8 * byte
                hi = min(lo + 8, reg.width)
                if lo >= reg.width:
                    break
                with m.If(write_word(offset, byte=byte)):
                    m.d[self.bus_domain] += storage[lo:hi].eq(w_data[8 * byte:8 * byte + hi - lo])

    def _ap_ctrl(self, m, ap, write_word, w_data, read_word):
        """``ap_ctrl_hs``: CTRL's bits, GIE, IER, ISR and the interrupt line."""
        on_bus = self.bus_domain
        ap_start, ap_done, ap_ready = ap["ap_start"], ap["ap_done"], ap["ap_ready"]
        ier, isr, gie = ap["ier"], ap["isr"], ap["gie"]
        ctrl_write = write_word(CTRL_OFFSET, byte=0)
        with m.If(ctrl_write & w_data[CtrlBit.AP_START]):
            m.d.sync += ap_start.eq(1)
        with m.Elif(self.accepted):
            m.d.sync += ap_start.eq(ap["auto_restart"])
        with m.If(ctrl_write):
            m.d[on_bus] += ap["auto_restart"].eq(w_data[CtrlBit.AUTO_RESTART])

        ctrl_read = read_word[CTRL_OFFSET]
        with m.If(self.done):
            m.d.sync += ap_done.eq(1)
        with m.Elif(ctrl_read):
            m.d.sync += ap_done.eq(0)
        with m.If(self.accepted):
            m.d.sync += ap_ready.eq(1)
        with m.Elif(ctrl_read):
            m.d.sync += ap_ready.eq(0)

        with m.If(write_word(GIE_OFFSET, byte=0)):
            m.d[on_bus] += gie.eq(w_data[GieBit.ENABLE])
        with m.If(write_word(IER_OFFSET, byte=0)):
            m.d[on_bus] += ier.eq(w_data[:len(IrqBit)])
        isr_write = write_word(ISR_OFFSET, byte=0)
        for bit, event in ((IrqBit.AP_DONE, self.done), (IrqBit.AP_READY, self.accepted)):
            with m.If(ier[bit] & event):
                m.d.sync += isr[bit].eq(1)
            with m.Elif(isr_write):
                m.d.sync += isr[bit].eq(isr[bit] ^ w_data[bit])

        m.d.comb += [
            self.start.eq(ap_start),
            self.interrupt.eq(gie & isr.any()),
        ]
