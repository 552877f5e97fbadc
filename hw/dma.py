"""AXI4 memory plumbing shared by the hardware units.

* :class:`ReadPort` — arbitrates read requests of several clients onto one AXI4 AR
  channel and routes R beats back by ID (each client has its own ID, so each client's
  beats arrive in its own request order). Every burst is checked against the client's
  configured buffer before it is issued: a request outside it is never sent, it raises
  ``fault`` instead.
* :class:`StreamReader` — reads ``count`` consecutive elements from a buffer with INCR
  bursts (never across 4 KiB), keeps as many bursts in flight as its FIFO has room for
  (credits are reserved at issue, so R beats are never back-pressured), and unpacks the
  beats into a stream of elements.
* :class:`WritePort` — queues write bursts (AW) and beats (W) and tracks B responses.

All clients see plain valid/ready streams; nothing here knows about graphs.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Elaboratable, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring

from .axi import BOUNDARY_BYTES, Burst, Resp, SkidBuffer, size_code
from .blocks import BufferedFIFO, RegisteredFIFO, decision


def read_request_layout(addr_width: int) -> data.StructLayout:
    """One read burst: byte address (beat aligned) and AxLEN (beats - 1)."""
    return data.StructLayout({"addr": addr_width, "len": 8})


def beats_to_boundary(addr, bytes_per_beat: int):
    """Beats from ``addr`` up to the next 4 KiB boundary (1 .. 4096/bytes_per_beat)."""
    offset = addr[:12]
    return (BOUNDARY_BYTES - offset) >> (bytes_per_beat.bit_length() - 1)


def _one_hot_select(selects, values):
    """The value whose select is high, as an AND-OR (at most one select is high)."""
    out = Mux(selects[0], values[0], 0)
    for sel, value in zip(selects[1:], values[1:]):
        out = out | Mux(sel, value, 0)
    return out


def _counted(m, inc, dec, limit: int, name: str):
    """A counter of ``inc`` minus ``dec`` pulses (never below 0 nor above ``limit``) and its
    ``== 0`` flag. The pulses are registered first and counted a cycle later (no carry
    chain behind the handshakes that make them); the flag is decided a cycle ahead from
    the counter's own flip-flops, and an increment still on its way clears it at once, so
    it is never high while something is counted. Returns (count, zero); the count lags
    the pulses by a cycle."""
    count = Signal(range(limit + 1), name=f"{name}_count")
    zero_q = Signal(init=1, name=f"{name}_zero")
    inc_q, dec_q = Signal(name=f"{name}_inc"), Signal(name=f"{name}_dec")
    m.d.sync += [inc_q.eq(inc), dec_q.eq(dec), count.eq(count + inc_q - dec_q)]
    with m.If(inc_q & ~dec_q):
        m.d.sync += zero_q.eq(0)
    with m.Elif(dec_q & ~inc_q):
        m.d.sync += zero_q.eq(count == 1)
    zero = Signal(name=f"{name}_none")
    m.d.comb += zero.eq(zero_q & ~inc_q)
    return count, zero


def _room_for_two(m, name: str, **queues):
    """Whether every one of ``queues`` (each a :class:`~.blocks.BufferedFIFO`, by name) holds
    at most ``depth - 2`` entries, as one register decided a cycle ahead from counts of
    their own (a compare of a FIFO's level would sit between it and the client's push, and
    one flag per queue would need a gate after them). Returns the flag."""
    room = Signal(init=1, name=f"{name}_room")
    nexts = []
    for queue_name, queue in queues.items():
        count = Signal(range(queue.depth + 1), name=f"{queue_name}_count")
        push, pop = queue.w_en, queue.r_en & queue.r_rdy
        m.d.sync += count.eq(count + push - pop)
        nexts.append(Mux(push & ~pop, count < queue.depth - 2,
                         Mux(pop & ~push, count < queue.depth, count < queue.depth - 1)))
    m.d.sync += room.eq(Cat(*nexts).all())
    return room


class ReadPort(Elaboratable):
    """Fixed-priority AR arbiter (client 0 first) with per-client buffer guards.

    Per client ``i``: ``requests[i]`` (stream of :func:`read_request_layout`),
    ``responses[i]`` (``valid``/``data``/``last``, no ready: clients reserve room before
    they request), ``guard_base[i]``/``guard_size[i]`` (the client's buffer).

    With ``registered_requests`` every client's requests pass a pipeline of their own: the
    guard's terms (the burst's end, its 4 KiB crossing, its start against the base), then
    the guard's verdict, then a small queue and a register slice, whose head the arbiter
    chooses among (a grant pops the slice, whose ready pops the queue; a burst outside its
    buffer raises ``fault`` at the verdict and is not queued, so the grant needs no guard
    term). A
    client's ``ready`` is a flip-flop (room in that pipeline, counted by credits), the
    arbiter's grant is two LUT levels from flip-flops, and nothing combinational runs from
    a client's logic into the arbitration or back: one request per cycle per client, each
    waiting a few cycles longer. In that mode the guard's limits are registered, so a
    guard must be set three cycles before its client requests.

    With ``zero_flag``, ``no_outstanding`` is a flip-flop: no beat requested (granted) and
    not yet returned.

    With ``held_limits`` (and ``registered_requests``) the guards' limits follow
    ``guard_base``/``guard_size`` only while ``load_limits`` is high, and hold (through
    resets too) while it is low: the owner raises it for at least two cycles between setting
    the guards and its clients' first request, and may keep it low for the rest of a run
    (the limits' adders then stay still).
    """

    #: requests per client between its ready and the arbiter (registered mode): the queue
    #: holds them all, and covers the six cycles from a request to its credit's return
    QUEUE_DEPTH = 6

    def __init__(self, bus, num_clients: int, *, registered_requests: bool = False,
                 zero_flag: bool = False, held_limits: bool = False):
        if held_limits and not registered_requests:
            raise ValueError("held_limits needs registered_requests (the limits are "
                             "registered only there)")
        self.bus = bus
        self.num_clients = num_clients
        self.registered_requests = registered_requests
        self.zero_flag = zero_flag
        self.held_limits = held_limits
        #: with ``held_limits``: the limits follow the guards while high
        self.load_limits = Signal() if held_limits else Const(1)
        aw = len(bus.araddr)
        dw = len(bus.rdata)
        self.bytes_per_beat = dw // 8
        req_sig = stream.Signature(read_request_layout(aw))
        self.requests = [req_sig.flip().create(path=(f"read_req{i}",)) for i in range(num_clients)]
        self.responses = [data.Signal(data.StructLayout({"valid": 1, "data": dw, "last": 1}),
                                      name=f"read_resp{i}") for i in range(num_clients)]
        self.guard_base = [Signal(aw, name=f"guard_base{i}") for i in range(num_clients)]
        self.guard_size = [Signal(aw, name=f"guard_size{i}") for i in range(num_clients)]
        self.enable = Signal(init=1)        # low: issue nothing (abort)
        self.fault = Signal()               # pulse: a request fell outside its buffer
        self.resp_error = Signal()          # pulse: an R beat came back with SLVERR/DECERR
        self.beat = Signal()                # pulse: one R beat accepted
        #: beats requested and not yet returned (with ``registered_requests``, a grant's
        #: beats from the cycle after it)
        self.outstanding = Signal(32)
        if zero_flag:
            #: no beat in flight, as a flip-flop updated with the count (no 32-bit
            #: compare behind a client's "nothing in flight" logic)
            self.no_outstanding = Signal(init=1)

    def _inside(self, m, addr, length, base, limit, prefix):
        """Guard: [addr, addr + bytes) inside [base, limit), and no 4 KiB crossing."""
        burst_bytes = (length + 1) * self.bytes_per_beat
        end = Signal(len(limit), name=f"{prefix}end")
        m.d.comb += end.eq(addr + burst_bytes)
        crosses = (addr[:12] + burst_bytes) > BOUNDARY_BYTES
        return (addr >= base) & (end <= limit) & ~crosses

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        aw = len(bus.araddr)

        n = self.num_clients
        if self.registered_requests:
            take = self._registered_arbiter(m)
        else:
            valids = [req.valid for req in self.requests]
            addrs = [req.payload.addr for req in self.requests]
            lens = [req.payload.len for req in self.requests]
            take = self._arbiter(m, valids, addrs, lens)

        # R: always ready; route by ID.
        r_fire = bus.rvalid & bus.rready
        m.d.comb += [bus.rready.eq(1), self.beat.eq(r_fire)]
        for i in range(self.num_clients):
            m.d.comb += [
                self.responses[i].valid.eq(r_fire & (bus.rid == i)),
                self.responses[i].data.eq(bus.rdata),
                self.responses[i].last.eq(bus.rlast),
            ]
        m.d.comb += self.resp_error.eq(r_fire & (bus.rresp >= Resp.SLVERR))
        if self.registered_requests:
            # the granted burst's beats join the count a cycle after its grant, from a
            # register (no carry chain behind the arbitration). Its first R beat comes two
            # cycles after the grant at the earliest (AR leaves its register the cycle after),
            # so the count never runs below zero; `no_outstanding` sees the grant at once
            wins, heads, ar_free = take[1:]
            granted = ar_free & Cat(*wins).any()
            added = Signal(9, name="granted_beats")
            added_m1 = Signal(signed(10), init=-1, name="granted_beats_m1")
            pending = Signal(name="grant_pending")
            m.d.sync += [
                pending.eq(granted),
                added.eq(Mux(granted, _one_hot_select(wins, [h.beats for h in heads]), 0)),
                added_m1.eq(Mux(granted, _one_hot_select(wins, [h.len for h in heads]), -1)),
                self.outstanding.eq(self.outstanding + Mux(r_fire, added_m1, added)),
            ]
        else:
            granted = take != 0
            pending = Const(0)
            m.d.sync += self.outstanding.eq(self.outstanding + (take - r_fire))
        if self.zero_flag:
            # a grant (this cycle's, or the last one's not yet counted) adds at least one
            # beat more than an R beat can take away; without one, the count reaches zero
            # from zero (no beat) or from one (its last beat)
            m.d.sync += self.no_outstanding.eq(
                ~granted & ~pending & Mux(r_fire, self.outstanding == 1, self.no_outstanding))
        return m

    def _arbiter(self, m, valids, addrs, lens):
        """Fixed priority among the clients' own requests, guard checked on the way out;
        returns the beats issued this cycle (0 or the granted burst's)."""
        bus = self.bus
        aw = len(bus.araddr)
        n = self.num_clients
        # Fixed priority: the lowest-numbered valid client wins.
        grant = Signal(range(max(n, 2)))
        any_valid = Signal()
        for i in reversed(range(n)):
            with m.If(valids[i]):
                m.d.comb += [grant.eq(i), any_valid.eq(1)]

        sel_addr = Signal(aw)
        sel_len = Signal(8)
        sel_base = Signal(aw)
        sel_size = Signal(aw)
        with m.Switch(grant):
            for i in range(n):
                with m.Case(i):
                    m.d.comb += [sel_addr.eq(addrs[i]), sel_len.eq(lens[i]),
                                 sel_base.eq(self.guard_base[i]), sel_size.eq(self.guard_size[i])]
        limit = Signal(aw + 1)
        m.d.comb += limit.eq(sel_base + sel_size)
        inside = self._inside(m, sel_addr, sel_len, sel_base, limit, "")

        # Registered AR output (one burst per cycle at most).
        ar_valid = Signal()
        ar_fire = bus.arvalid & bus.arready
        take = any_valid & self.enable & inside & (~ar_valid | ar_fire)
        m.d.comb += [
            bus.arvalid.eq(ar_valid),
            bus.arsize.eq(size_code(len(bus.rdata))),
            bus.arburst.eq(Burst.INCR),
            self.fault.eq(any_valid & self.enable & ~inside),
        ]
        with m.If(ar_fire):
            m.d.sync += ar_valid.eq(0)
        with m.If(take):
            m.d.sync += [ar_valid.eq(1), bus.araddr.eq(sel_addr), bus.arlen.eq(sel_len),
                         bus.arid.eq(grant)]
        for i in range(n):
            m.d.comb += self.requests[i].ready.eq(take & (grant == i))
        return Mux(take, sel_len + 1, 0)

    def _registered_arbiter(self, m):
        """Per client: guard terms, guard verdict, queue; fixed priority among the queue
        heads. Returns each client's grant pulse, its head's win (before the AR register's
        room), its head, and whether the AR register takes a burst."""
        bus = self.bus
        aw = len(bus.araddr)
        beat_bits = self.bytes_per_beat.bit_length() - 1
        entry = data.StructLayout({"addr": aw, "len": 8, "beats": 9})
        heads, pops, refused = [], [], []
        for i, req in enumerate(self.requests):
            # its valid and level are flip-flops (the credits guarantee room)
            queue = RegisteredFIFO(entry, self.QUEUE_DEPTH)
            m.submodules[f"queue{i}"] = queue
            # the limits, registered: the buffer is [base, limit), and a burst's last beat
            # may start at limit - bytes_per_beat at the latest
            limit = Signal(aw + 1, name=f"guard_limit{i}", reset_less=self.held_limits)
            last_end = Signal(signed(aw + 2), name=f"guard_last_end{i}",
                              reset_less=self.held_limits)
            with m.If(self.load_limits):
                m.d.sync += [limit.eq(self.guard_base[i] + self.guard_size[i]),
                             last_end.eq(limit - self.bytes_per_beat)]
            # credits: room in the two guard stages and the queue
            room = Signal(range(self.QUEUE_DEPTH + 1), init=self.QUEUE_DEPTH, name=f"room{i}")
            has_room = Signal(init=1, name=f"has_room{i}")
            accept = req.valid & req.ready
            pop = Signal(name=f"pop{i}")
            m.d.comb += req.ready.eq(has_room)
            m.d.sync += [room.eq(room - accept + pop),
                         has_room.eq(Mux(accept & ~pop, room != 1, Mux(~accept & pop, 1, room != 0)))]
            # stage 1: the guard's terms, one adder or comparator each
            s1 = {k: Signal(w, name=f"g{i}_{k}", reset_less=True)
                  for k, w in (("addr", aw), ("len", 8), ("beats", 9), ("end_m1", aw + 1),
                               ("low", 1), ("crosses", 1))}
            s1_valid = Signal(name=f"g{i}_valid")
            addr, length = req.payload.addr, req.payload.len
            m.d.sync += [
                s1_valid.eq(accept), s1["addr"].eq(addr), s1["len"].eq(length),
                s1["beats"].eq(length + 1),
                s1["end_m1"].eq(addr + (length << beat_bits)),     # end - bytes_per_beat
                s1["low"].eq(addr >= self.guard_base[i]),
                s1["crosses"].eq(addr[:12] + (length << beat_bits) >
                                 BOUNDARY_BYTES - self.bytes_per_beat),
            ]
            # stage 2: the verdict; a burst inside its buffer goes into the queue, one
            # outside raises `fault` and goes no further (its credit is not given back:
            # the client waits, as for a burst that never returns, until the port is reset)
            verdict = Signal(entry, name=f"g{i}_entry", reset_less=True)
            verdict_valid = Signal(name=f"g{i}_verdict_valid")
            inside = Signal(name=f"g{i}_inside")
            # it loads only behind a request (the simulation skips its 66-bit compare in
            # the cycles without one)
            m.d.sync += verdict_valid.eq(s1_valid)
            with m.If(s1_valid):
                m.d.sync += [
                    verdict.addr.eq(s1["addr"]), verdict.len.eq(s1["len"]),
                    verdict.beats.eq(s1["beats"]),
                    inside.eq(s1["low"] & ~s1["crosses"] & (s1["end_m1"].as_signed() <= last_end)),
                ]
            refused.append(verdict_valid & ~inside)
            # the head leaves the queue through a register slice: the grant pops the
            # slice's two registers, not the queue's counters (the queue's pop is the
            # slice's ready, a flip-flop)
            head = SkidBuffer(entry)
            m.submodules[f"head{i}"] = head
            m.d.comb += [queue.w.valid.eq(verdict_valid & inside), queue.w.payload.eq(verdict)]
            wiring.connect(m, queue.r, head.i)
            m.d.comb += head.o.ready.eq(pop)
            heads.append((head.o.valid, head.o.payload))
            pops.append(pop)

        # fixed priority, one-hot: a client is granted when it has a head and no client
        # before it has one (every head is inside its buffer: a grant is from the heads'
        # valid flip-flops alone)
        ar_valid = Signal()
        ar_fire = bus.arvalid & bus.arready
        ar_free = self.enable & (~ar_valid | ar_fire)
        wins = [ready & ~Cat(*[r for r, _ in heads[:i]]).any() if i else ready
                for i, (ready, _) in enumerate(heads)]
        # each grant (a head's pop) and the AR register's take: decisions of their own, a
        # LUT of the heads' valid flip-flops, the enable and the AR register's room, in
        # front of the heads' and the AR payload's wide enables
        room = dict(enable=self.enable, ar_valid=ar_valid, ar_ready=bus.arready)
        valids = Cat(*[ready for ready, _ in heads])
        takes = [decision(m, f"grant{i}",
                          lambda enable, ar_valid, ar_ready, up_to, i=i:
                          enable & (~ar_valid | ar_ready) & up_to[i] & ~up_to[:i].any(),
                          **room, up_to=valids[:i + 1])
                 for i in range(len(heads))]
        take = decision(m, "ar_take",
                        lambda enable, ar_valid, ar_ready, valids:
                        enable & (~ar_valid | ar_ready) & valids.any(), **room, valids=valids)
        m.d.comb += [
            bus.arvalid.eq(ar_valid),
            bus.arsize.eq(size_code(len(bus.rdata))),
            bus.arburst.eq(Burst.INCR),
            self.fault.eq(Cat(*refused).any() & self.enable),
        ]
        m.d.comb += [pop.eq(t) for pop, t in zip(pops, takes)]
        with m.If(ar_fire):
            m.d.sync += ar_valid.eq(0)
        # under `take` the wins are the takes: the AR register's room (the bus's ready, the
        # enable) reaches only the register's enable, not the select of its wide inputs
        with m.If(take):
            m.d.sync += [
                ar_valid.eq(1),
                bus.araddr.eq(_one_hot_select(wins, [h.addr for _, h in heads])),
                bus.arlen.eq(_one_hot_select(wins, [h.len for _, h in heads])),
                bus.arid.eq(_one_hot_select(wins, [Const(i, len(bus.arid))
                                                   for i in range(len(heads))])),
            ]
        return takes, wins, [h for _, h in heads], ar_free


class StreamReader(Elaboratable):
    """Streams ``count`` elements of ``elem_width`` bits starting at a beat-aligned ``base``.

    Connect ``request`` to a :class:`ReadPort` client and feed ``response`` from it.
    ``start`` (one cycle) latches ``base`` and ``count``; ``elements`` then yields exactly
    ``count`` elements, least significant first within each beat. The request leaves from
    registers, computed a cycle ahead: at most one burst every two cycles, which with bursts
    of up to ``max_burst`` beats does not limit the stream.
    """

    def __init__(self, *, addr_width: int, data_width: int, elem_width: int,
                 fifo_beats: int = 32, max_burst: int = 16):
        if data_width % elem_width:
            raise ValueError("elem_width must divide data_width")
        if max_burst > fifo_beats:
            raise ValueError("max_burst must not exceed fifo_beats")
        self.addr_width = addr_width
        self.data_width = data_width
        self.elem_width = elem_width
        self.fifo_beats = fifo_beats
        self.max_burst = max_burst
        self.start = Signal()
        self.base = Signal(addr_width)
        self.count = Signal(32)
        self.request = stream.Signature(read_request_layout(addr_width)).create(path=("request",))
        self.response = data.Signal(data.StructLayout({"valid": 1, "data": data_width, "last": 1}))
        self.elements = stream.Signature(elem_width).create(path=("elements",))
        self.done = Signal()   # all elements delivered

    def elaborate(self, platform):
        m = Module()
        bpb = self.data_width // 8
        per_beat = self.data_width // self.elem_width
        elem_bytes = self.elem_width // 8
        # its valid and level are flip-flops (credits reserve room for every beat)
        m.submodules.beats = beats = RegisteredFIFO(self.data_width, self.fifo_beats)

        next_addr = Signal(self.addr_width)
        beats_left = Signal(34)
        elems_left = Signal(32)
        credits = Signal(range(self.fifo_beats + 1), init=self.fifo_beats)
        sel = Signal(range(per_beat))
        issue, burst = self._request(m, next_addr, beats_left, credits, bpb)

        m.d.comb += [beats.w.valid.eq(self.response.valid), beats.w.payload.eq(self.response.data)]
        # the beats leave the FIFO through a register slice: the unpacker pops the slice's
        # two registers, and the FIFO's counters see only the slice's ready, a flip-flop
        # (the credits count the slice's beats too)
        m.submodules.head = head = SkidBuffer(self.data_width)
        wiring.connect(m, beats.r, head.i)

        # Unpack: one element per cycle. Whether elements are left, whether this is the
        # last, whether this element ends its beat (`ends_beat`: the last of the beat or of
        # the stream) are flip-flops decided a cycle ahead (no compare before the pop).
        has_elems, last_elem = Signal(), Signal()
        sel_last = Signal(init=per_beat == 1)     # sel == per_beat - 1, a register
        ends_beat = Signal()
        take = self.elements.valid & self.elements.ready
        m.d.comb += [
            self.elements.valid.eq(head.o.valid & has_elems),
            self.elements.payload.eq(head.o.payload.word_select(sel, self.elem_width)),
            head.o.ready.eq(head.o.valid & self.elements.ready & ends_beat),
            self.done.eq(~has_elems),
        ]
        with m.If(take):
            beat_ends = sel_last | last_elem
            next_sel_last = Mux(beat_ends, per_beat == 1, sel == per_beat - 2)
            m.d.sync += [elems_left.eq(elems_left - 1), sel.eq(Mux(beat_ends, 0, sel + 1)),
                         sel_last.eq(next_sel_last), has_elems.eq(~last_elem),
                         last_elem.eq(elems_left == 2),
                         ends_beat.eq(~last_elem & (next_sel_last | (elems_left == 2)))]
        # a burst's credits are taken a cycle after it is issued (from a register: the
        # issue, a handshake, reaches no carry chain) and each beat's given back as it
        # leaves. The next request looks at the credits three cycles after an issue at
        # the earliest (see _request), when they include it.
        issued = Signal.like(burst, name="issued_beats")
        m.d.sync += [issued.eq(Mux(issue, burst, 0)),
                     credits.eq(credits - issued + head.o.ready)]

        with m.If(self.start):
            total_bytes = self.count * elem_bytes
            m.d.sync += [
                next_addr.eq(self.base),
                beats_left.eq((total_bytes + bpb - 1) >> (bpb.bit_length() - 1)),
                elems_left.eq(self.count), has_elems.eq(self.count != 0),
                last_elem.eq(self.count == 1),
                sel.eq(0), sel_last.eq(per_beat == 1),
                ends_beat.eq((self.count != 0) & ((per_beat == 1) | (self.count == 1))),
            ]
        return m

    def _request(self, m, next_addr, beats_left, credits, bpb):
        """The next burst, computed from registers in three registered steps (its
        boundary room and the remaining beats' cap; their minimum and its AxLEN; whether
        the credits cover it), so its valid and length leave flip-flops and no step holds
        more than one carry chain. The steps describe the state three cycles back: the
        three cycles after an issue or a start are blocked (``fresh``), and otherwise only
        the FIFO's pops have changed the state since, which only add credits: a request
        once valid stays valid."""
        M = self.max_burst
        to_boundary = Signal(range(4096 // bpb + 1), name="to_boundary")
        capped = Signal(range(M + 1), name="capped")          # min(max_burst, beats_left)
        any_left = Signal(name="any_left")
        m.d.sync += [to_boundary.eq(beats_to_boundary(next_addr, bpb)),
                     capped.eq(Mux(beats_left < M, beats_left, M)), any_left.eq(beats_left != 0)]
        next_burst = Signal(range(M + 1), name="next_burst")    # ... and never across 4 KiB
        next_len = Signal(8, name="next_len")
        burst_left = Signal(name="burst_left")
        shorter = to_boundary < capped
        m.d.sync += [next_burst.eq(Mux(shorter, to_boundary, capped)),
                     next_len.eq(Mux(shorter, to_boundary - 1, capped - 1)),
                     burst_left.eq(any_left)]
        can_issue = Signal()
        m.d.sync += can_issue.eq(burst_left & (credits >= next_burst))
        fresh = Signal(3, init=0b111)
        m.d.sync += fresh.eq(fresh >> 1)
        m.d.comb += [
            self.request.valid.eq(can_issue & ~fresh[0]),
            self.request.payload.addr.eq(next_addr),
            self.request.payload.len.eq(next_len),
        ]
        issue = self.request.valid & self.request.ready
        with m.If(issue):
            m.d.sync += [next_addr.eq(next_addr + (next_burst << (bpb.bit_length() - 1))),
                         beats_left.eq(beats_left - next_burst), fresh.eq(0b111)]
        with m.If(self.start):
            m.d.sync += fresh.eq(0b111)
        return issue, next_burst


def write_address_layout(addr_width: int) -> data.StructLayout:
    return data.StructLayout({"addr": addr_width, "len": 8})


def write_beat_layout(data_width: int) -> data.StructLayout:
    return data.StructLayout({"data": data_width, "strb": data_width // 8, "last": 1})


class ContiguousBeatQueue(Elaboratable):
    """The address queue of a coalescing :class:`WritePort`: a
    :class:`~.blocks.BufferedFIFO` of single-beat writes (``w_en``,
    ``w_data``, ``w_rdy``, ``r_en``, ``r_data``, ``r_rdy`` as there) that also hands out
    ``r_joinable``: whether the head's address is the previous pushed beat's plus one beat
    with no 4 KiB boundary between them. The flag is decided as each beat is pushed, so
    the 64-bit address compare runs in front of the queue's storage, not behind its head.
    """

    def __init__(self, layout: data.StructLayout, depth: int, bytes_per_beat: int):
        self.layout = layout
        self.bytes_per_beat = bytes_per_beat
        self.depth = depth
        self._queue = BufferedFIFO(width=layout.size + 1, depth=depth)
        self.w_en, self.w_rdy = self._queue.w_en, self._queue.w_rdy
        self.r_en, self.r_rdy = self._queue.r_en, self._queue.r_rdy
        self.w_data = Signal(layout.size)
        self.r_data = Signal(layout.size)
        self.r_joinable = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.queue = queue = self._queue
        addr = data.View(self.layout, self.w_data).addr
        after_last = Signal.like(addr)       # the address after the last beat pushed
        joinable = (addr == after_last) & (addr[:12] != 0)
        m.d.comb += [queue.w_data.eq(Cat(self.w_data, joinable)),
                     self.r_data.eq(queue.r_data[:-1]), self.r_joinable.eq(queue.r_data[-1])]
        with m.If(self.w_en & self.w_rdy):
            m.d.sync += after_last.eq(addr + self.bytes_per_beat)
        return m


class WritePort(Elaboratable):
    """Drives the AW/W/B channels of ``bus`` from two queues the client fills.

    Push a burst into ``address`` (``w_en``/``w_data``/``w_rdy`` of a FIFO) and its beats
    into ``beats`` (``last`` on the final beat of each burst); AXI lets W run ahead of AW.

    With ``coalesce`` the client pushes single beats only (``len`` 0, ``last`` set) and the
    port joins consecutive ones (each beat's address the previous one's plus a beat) into
    INCR bursts of up to ``max_burst`` beats, never across a 4 KiB boundary, keeping every
    beat's WSTRB. A burst closes when the next beat is not consecutive, when it is full,
    at a 4 KiB boundary, or when no beat is waiting; its AW leaves once all its beats are
    queued, so W never waits for data inside a burst. A burst covers only bytes of beats
    the client pushed, so a client that checks every beat against its buffer keeps every
    burst inside it. :attr:`idle` then also waits for the bursts being formed. ``address``
    is then a :class:`ContiguousBeatQueue` (the same push side as a FIFO's), which decides
    as a beat is pushed whether it continues the one before: every term of the burst
    decision leaves a flip-flop, and a beat takes no extra cycle.
    """

    def __init__(self, bus, *, beat_depth: int = 16, address_depth: int = 4,
                 coalesce: bool = False, max_burst: int = 16):
        if coalesce and not 2 <= max_burst <= 256:
            raise ValueError(f"WritePort max_burst must be in 2..256, not {max_burst}")
        self.bus = bus
        aw = len(bus.awaddr)
        dw = len(bus.wdata)
        self._aw_layout = write_address_layout(aw)
        self._w_layout = write_beat_layout(dw)
        self.coalesce = coalesce
        self.max_burst = max_burst
        if coalesce:
            self.address = ContiguousBeatQueue(self._aw_layout, address_depth, dw // 8)
        else:
            self.address = BufferedFIFO(width=self._aw_layout.size, depth=address_depth)
        self.beats = BufferedFIFO(width=self._w_layout.size, depth=beat_depth)
        self.enable = Signal(init=1)
        self.beat = Signal()          # pulse: one W beat accepted
        self.resp_error = Signal()    # pulse: B came back with SLVERR/DECERR
        self.outstanding = Signal(16)  # bursts issued on AW without their B yet
        self.idle = Signal()
        #: both client queues have room for two more entries: two flip-flops decided a
        #: cycle ahead (the queues' own ``w_rdy`` compare their levels); a client that
        #: pushes only while it is high never finds a queue full
        self.room = Signal()

    def _coalescer(self, m):
        """Single beats from the client queues -> (AW queue, W queue) of whole bursts;
        returns the two queues and a signal that is high while a burst is being formed."""
        aw_q = BufferedFIFO(width=self._aw_layout.size, depth=4)
        w_q = BufferedFIFO(width=self._w_layout.size, depth=self.max_burst + 2)
        m.submodules.burst_address = aw_q
        m.submodules.burst_beats = w_q
        head = data.View(self._aw_layout, self.address.r_data)
        beat = data.View(self._w_layout, self.beats.r_data)
        forming = Signal()                       # a burst is open; its last beat is `tail`
        start = Signal.like(head.addr)
        count = Signal(range(self.max_burst + 1))
        full = Signal()                          # count == max_burst, a register
        tail = Signal(self._w_layout)
        # room for two more beats in the W queue, and (pushed only while it holds at most
        # depth - 2, so its inner queue, whose level compare is its w_rdy, has room) for one
        # more burst in the AW queue
        room = _room_for_two(m, "burst_queues", w_queue=w_q, aw_queue=aw_q)
        # every term of the burst decision is a flip-flop: the queues' heads and flags, the
        # open burst's state and the rooms
        # each decision in a module of its own (see blocks.own_module): they enable the
        # queues' counters and the open burst's registers
        flags = {"room": room, "head": self.address.r_rdy, "beat": self.beats.r_rdy}
        joins = forming & self.address.r_joinable & ~full
        take = decision(m, "take_beat", lambda room, head, beat: room & head & beat, **flags)
        close = decision(m, "close_burst", lambda room, head, beat, forming, joinable, full:
                         forming & room & ~(head & beat & joinable & ~full),
                         **flags, forming=forming, joinable=self.address.r_joinable, full=full)
        # an open burst gives the W queue a beat in every cycle there is room: its tail,
        # either joined by the next beat or closing the burst
        push_beat = decision(m, "push_beat", lambda room, forming: forming & room,
                             room=room, forming=forming)
        aw_out = data.Signal(self._aw_layout)
        w_out = data.Signal(self._w_layout)
        m.d.comb += [
            aw_out.addr.eq(start), aw_out.len.eq(count - 1),
            w_out.data.eq(tail.data), w_out.strb.eq(tail.strb), w_out.last.eq(close),
            aw_q.w_data.eq(aw_out), aw_q.w_en.eq(close),
            w_q.w_data.eq(w_out), w_q.w_en.eq(push_beat),
            self.address.r_en.eq(take), self.beats.r_en.eq(take),
        ]
        with m.If(close):
            m.d.sync += forming.eq(0)
        with m.If(take):
            m.d.sync += [forming.eq(1), tail.eq(beat)]
            with m.If(joins):
                m.d.sync += [count.eq(count + 1), full.eq(count == self.max_burst - 1)]
            with m.Else():
                m.d.sync += [start.eq(head.addr), count.eq(1), full.eq(0)]
        return aw_q, w_q, forming

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        m.submodules.address = self.address
        m.submodules.beats = self.beats
        if self.coalesce:
            aw_q, w_q, _ = self._coalescer(m)
        else:
            aw_q, w_q = self.address, self.beats
        m.d.comb += self.room.eq(_room_for_two(m, "client_queues", address=self.address,
                                               beats=self.beats))
        head = data.View(self._aw_layout, aw_q.r_data)
        beat = data.View(self._w_layout, w_q.r_data)
        aw_fire = bus.awvalid & bus.awready
        w_fire = bus.wvalid & bus.wready
        b_fire = bus.bvalid & bus.bready
        # idle from three counts whose zero flags are registers decided a cycle ahead (the
        # FIFOs' levels add their output registers' valid: a carry chain and a compare):
        # beats pushed and not yet sent on W, bursts queued and not yet sent on AW, bursts
        # sent and not yet answered. A burst's last beat is pushed into the W queue in the
        # cycle its AW is queued, so some beat or its AW is always counted.
        limit = self.beats.depth + self.address.depth + self.max_burst + 8
        _, beats_zero = _counted(m, self.beats.w_en & self.beats.w_rdy, w_fire, limit, "w_beats")
        aw_in = aw_q.w_en & aw_q.w_rdy
        _, aw_zero = _counted(m, aw_in, aw_fire, limit, "aw_queued")
        b_count, b_zero = _counted(m, aw_fire, b_fire, 2**16 - 1, "b_pending")
        m.d.comb += [
            bus.awvalid.eq(aw_q.r_rdy),
            bus.awaddr.eq(head.addr),
            bus.awlen.eq(head.len),
            bus.awsize.eq(size_code(len(bus.wdata))),
            bus.awburst.eq(Burst.INCR),
            bus.awid.eq(0),
            aw_q.r_en.eq(aw_fire),
            bus.wvalid.eq(w_q.r_rdy),
            bus.wdata.eq(beat.data),
            bus.wstrb.eq(beat.strb),
            bus.wlast.eq(beat.last),
            w_q.r_en.eq(w_fire),
            bus.bready.eq(1),
            self.beat.eq(w_fire),
            self.resp_error.eq(b_fire & (bus.bresp >= Resp.SLVERR)),
            self.idle.eq(beats_zero & aw_zero & b_zero),
        ]
        m.d.comb += self.outstanding.eq(b_count)
        return m
