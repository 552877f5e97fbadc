"""The Aggregator's edge walk (the register slices in front of it are
:class:`~.blocks.StreamRegister`, importable from here too)."""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .blocks import StreamRegister  # noqa: F401  (importable from here too)


def descriptor_layout(elem_width: int) -> data.StructLayout:
    """One gathered row's instructions for the reduce: its weight, whether it is its
    node's last (``empty``: the node had no valid edge, no row goes with it) and, on the
    last, the node's valid edges (``count``, where the walk counts them: a mean)."""
    return data.StructLayout({"weight": signed(elem_width), "last": 1, "empty": 1, "count": 32})


def node_bounds_layout() -> data.StructLayout:
    """One node's clamped stream range, with the flags the walk would otherwise compare
    for (:class:`PointerClamp`)."""
    return data.StructLayout({
        "end": 32,          # p(v): the node's positions end here
        "empty": 1,         # p(v) == p(v-1)
        "single": 1,        # p(v) == p(v-1) + 1
        "end_is_last": 1,   # p(v) == E
        "end_before_last": 1,  # p(v) == E - 1
        "bad": 1,           # indptr[v] lies outside [p(v-1), E] (indptr[0]: is not 0)
        "not_end": 1,       # indptr[v] != E (bad on the last pointer)
    })


class PointerClamp(wiring.Component):
    """The row pointers clamped, ``p(v) = min(max(indptr[v], p(v-1)), E)`` (``p(-1) = 0``),
    one node's bounds and flags at a time.

    Two register stages, both fed from flip-flops: the first compares the pointer with
    ``p(v-1)``, ``p(v-1) + 1``, ``E`` and ``E - 1``; the second chooses ``p(v)`` and the
    flags from those compares and updates ``p(v-1)``. A pointer enters the first stage
    only while it is empty (so its compares see every earlier pointer), and the second
    stage only an empty output, so the clamp passes a pointer every two cycles, the most
    the walk asks for (a node takes at least two of its cycles).

    Ports:
        i: In stream, the row pointers (``indptr[0]`` first; from a register).
        o: Out stream of :func:`node_bounds_layout`.
        run: In, pointers are taken from the cycle after it is first high.
        num_edges: In, ``E`` (held while the clamp runs).
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(32)),
            "o": Out(stream.Signature(node_bounds_layout())),
            "run": In(1), "num_edges": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        num_edges = self.num_edges
        # E's neighbours and flags, registered every cycle (the run's configuration holds
        # for cycles before its first pointer arrives)
        e_minus1, e_plus1 = Signal(32, reset_less=True), Signal(32, reset_less=True)
        e_is0, e_is1 = Signal(reset_less=True), Signal(reset_less=True)
        m.d.sync += [e_minus1.eq(num_edges - 1), e_plus1.eq(num_edges + 1),
                     e_is0.eq(num_edges == 0), e_is1.eq(num_edges == 1)]
        started = Signal()
        m.d.sync += started.eq(started | self.run)
        prev, prev1 = Signal(32), Signal(32, init=1)     # p(v-1), p(v-1) + 1
        prev_is_last, prev_before_last = Signal(), Signal()
        first = Signal(init=1)                             # the next pointer is indptr[0]

        # stage 1: the pointer and its compares
        mid_valid = Signal()
        p, p1 = Signal(32), Signal(32)
        cmp = Signal(data.StructLayout({"lt": 1, "le": 1, "gt": 1, "ge": 1, "single": 1,
                                        "before_last": 1, "nonzero": 1, "not_end": 1,
                                        "first": 1}))
        x = self.i.payload
        take = self.i.valid & self.i.ready
        m.d.comb += self.i.ready.eq(started & ~mid_valid)
        with m.If(take):
            m.d.sync += [p.eq(x), p1.eq(x + 1), first.eq(0),
                         cmp.lt.eq(x < prev), cmp.le.eq(x <= prev),
                         cmp.gt.eq(x > num_edges), cmp.ge.eq(x >= num_edges),
                         cmp.single.eq(x == prev1), cmp.before_last.eq(x == e_minus1),
                         cmp.nonzero.eq(x != 0), cmp.not_end.eq(x != num_edges),
                         cmp.first.eq(first)]

        # stage 2: p(v) and its flags, from the compares
        o = self.o.payload
        # into an empty output only: the consumer's ready (its load, a walk state's
        # decision) reaches the valid flag, not the enables of the bounds and p(v-1); the
        # walk takes a node every two cycles at most, which this still keeps up with
        move = mid_valid & ~self.o.valid
        m.d.sync += mid_valid.eq(take | (mid_valid & ~move))
        m.d.sync += self.o.valid.eq(move | (self.o.valid & ~self.o.ready))
        was_last = Mux(cmp.first, e_is0, prev_is_last)
        was_before_last = Mux(cmp.first, e_is1, prev_before_last)
        end = Mux(cmp.le, prev, Mux(cmp.gt, num_edges, p))
        end_is_last = cmp.ge | was_last
        end_before_last = Mux(cmp.le, was_before_last, ~cmp.gt & cmp.before_last)
        with m.If(move):
            m.d.sync += [
                prev.eq(end), prev1.eq(Mux(cmp.le, prev1, Mux(cmp.gt, e_plus1, p1))),
                prev_is_last.eq(end_is_last), prev_before_last.eq(end_before_last),
                o.end.eq(end), o.empty.eq(cmp.le | was_last),
                o.single.eq(~cmp.le & Mux(cmp.gt, was_before_last, cmp.single)),
                o.end_is_last.eq(end_is_last), o.end_before_last.eq(end_before_last),
                o.bad.eq(Mux(cmp.first, cmp.nonzero, cmp.lt | cmp.gt)),
                o.not_end.eq(cmp.not_end),
            ]
        return m


class EdgeWalk(wiring.Component):
    """Walks the CSR: one row index and one descriptor per valid edge, node by node.

    Node ``v`` owns stream positions ``[p(v), p(v+1))`` of the clamped row pointers
    ``p(v) = min(max(indptr[v], p(v-1)), E)`` (``p(-1) = 0``); positions before ``p(0)``
    and after ``p(N)`` are read and discarded. An index ``>= N`` is skipped and counted.
    A descriptor leaves one edge late, when it is known whether that edge is its node's
    last; a node without valid edges gets one ``empty`` descriptor.

    Ports:
        pointers, indices, weights: the metadata streams (``weights`` only read with
            ``use_weights``; every weight is 1 without). The pointers pass a
            :class:`PointerClamp` of the walk's own, indices and weights a register slice
            that joins them (each index compared with ``num_nodes`` on its way in); the
            configuration must hold while the walk runs. ``pointers`` and ``weights``
            still need a slice in front (a weight is read only when an index is there
            too).
        rows: the source index of every valid edge; never refused: the walk holds
            ``row_slots`` credits, one returned by each ``row_done`` pulse.
        descriptors: likewise, ``desc_slots`` credits returned by ``desc_done``.
        run: the walk may start (it then waits for ``indptr[0]``).
        num_nodes, num_edges, use_weights: the run's configuration.
        count_edges: a last descriptor's ``count`` is its node's valid edges (a mean
            divides by it); without, every count is 0. Constant while the walk runs.
        edge, rejected: pulses, a valid / rejected index consumed.
        bad_indptr: some row pointer was clamped (sticky for the run).
        done: every position of the index stream consumed.
    """

    def __init__(self, *, elem_width: int, row_slots: int, desc_slots: int):
        self.ew, self.row_slots, self.desc_slots = elem_width, row_slots, desc_slots
        super().__init__({
            "pointers": In(stream.Signature(32)),
            "indices": In(stream.Signature(32)),
            "weights": In(stream.Signature(elem_width)),
            "rows": Out(stream.Signature(32, always_ready=True)),
            "descriptors": Out(stream.Signature(descriptor_layout(elem_width), always_ready=True)),
            "row_done": In(1), "desc_done": In(1),
            "run": In(1), "num_nodes": In(32), "num_edges": In(32), "use_weights": In(1),
            "count_edges": In(1),
            "edge": Out(1), "rejected": Out(1), "bad_indptr": Out(1), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ew, num_nodes, num_edges, use_weights = self.ew, self.num_nodes, self.num_edges, self.use_weights
        m.submodules.clamp = clamp = PointerClamp()
        wiring.connect(m, wiring.flipped(self.pointers), clamp.i)
        m.d.comb += [clamp.run.eq(self.run), clamp.num_edges.eq(num_edges)]
        ptr, node = clamp.o, clamp.o.payload
        edge_in = self._edge_slice(m)
        edge_ready, index_ok = edge_in.valid, edge_in.payload.ok

        # the state, one flip-flop per state (each set from its next-state terms): no decode
        # in front of the streams' ready
        s_first, s_skip, s_next, s_edges, s_close, s_tail, s_done = (
            Signal(init=name == "first", name=f"walk_{name}") for name in
            ("first", "skip", "next", "edges", "close", "tail", "done"))
        in_skip = Signal()          # s_skip | s_tail
        no_nodes = Signal(reset_less=True)      # num_nodes == 0, registered every cycle
        m.d.sync += no_nodes.eq(num_nodes == 0)
        pos = Signal(32)
        pos_next = Signal(32, init=1)   # pos + 1, counted beside it
        pos_next2 = Signal(32, init=2)  # pos + 2, likewise
        target = Signal(32)             # end of the current node (or of the skip)
        target_is_last, target_before_last = Signal(), Signal()     # target == E, == E - 1
        node_count = Signal(32)         # valid edges of the current node
        held = Signal()                 # a valid edge waiting to learn whether it is last
        held_weight = Signal(signed(ew), reset_less=True)
        # flip-flops that say what a compare of counters would: pos == target,
        # pos + 1 == target, room for a row and for a descriptor (each set a cycle ahead from
        # each way its counters can go)
        at_target = Signal(init=1)
        at_last = Signal()
        row_room = Signal(init=self.row_slots != 0)
        can_emit = Signal(init=self.desc_slots != 0)
        emit, desc = self.descriptors.valid, self.descriptors.payload
        close = s_close & can_emit          # the node's last descriptor leaves
        last_node = self._last_node(m, num_nodes, close)

        consume = Signal()
        # an edge taken in EDGES, from the flip-flops alone rather than through `consume`
        # (which enables the position counters): the row's valid, the credits and the
        # descriptor start here (in_skip and s_edges are never both set)
        edge_go = Signal()
        m.d.comb += [edge_go.eq(edge_ready & s_edges & row_room & can_emit),
                     consume.eq(edge_ready & ((in_skip & ~at_target) |
                                              (s_edges & row_room & can_emit))),
                     edge_in.ready.eq(consume),
                     self.rows.payload.eq(edge_in.payload.index),
                     self.done.eq(s_done)]
        load = (s_first & self.run | s_next) & ptr.valid    # a node's bounds taken
        skip_end, tail_end = s_skip & at_target, s_tail & at_target
        last_edge = edge_go & at_last
        to_tail = (skip_end & no_nodes) | (close & last_node)
        m.d.comb += ptr.ready.eq(load)
        next_first = s_first & ~load
        next_skip = (s_skip & ~at_target) | (s_first & load)
        next_tail = (s_tail & ~at_target) | to_tail
        m.d.sync += [
            s_first.eq(next_first), s_skip.eq(next_skip), s_tail.eq(next_tail),
            in_skip.eq(next_skip | next_tail),
            s_next.eq((s_next & ~ptr.valid) | (skip_end & ~no_nodes) | (close & ~last_node)),
            s_edges.eq((s_edges & ~last_edge) | (s_next & load & ~node.empty)),
            s_close.eq((s_close & ~can_emit) | (s_next & load & node.empty) | last_edge),
            s_done.eq(s_done | tail_end),
        ]

        with m.If(load):        # pos == target here: the node's flags are the walk's
            m.d.sync += [target.eq(node.end), at_target.eq(node.empty), at_last.eq(node.single),
                         target_is_last.eq(node.end_is_last),
                         target_before_last.eq(node.end_before_last), node_count.eq(0)]
            with m.If(node.bad | (s_next & last_node & node.not_end)):
                m.d.sync += self.bad_indptr.eq(1)
        with m.If(consume):
            m.d.sync += [pos.eq(pos + 1), pos_next.eq(pos_next + 1),
                         pos_next2.eq(pos_next2 + 1), at_target.eq(at_last),
                         at_last.eq(pos_next2 == target)]
        with m.If(to_tail):     # from pos == target: the rest of the stream is discarded
            m.d.sync += [at_target.eq(target_is_last), at_last.eq(target_before_last)]
        # the tail's target is E. CLOSE uses no target (nothing is consumed), so every
        # CLOSE cycle loads it (a node after this one loads its own): the late "last node"
        # decision enables no wide register
        with m.If(s_close | (skip_end & no_nodes)):
            m.d.sync += target.eq(num_edges)

        with m.If(edge_go):
            with m.If(index_ok):
                m.d.comb += [self.rows.valid.eq(1), self.edge.eq(1), emit.eq(held)]
                m.d.sync += held.eq(1)
            with m.Else():
                m.d.comb += self.rejected.eq(1)
        with m.If(close):
            m.d.comb += emit.eq(1)
            m.d.sync += held.eq(0)
        # the weight and the count load only where the run uses them, on flags the edge
        # brings from its slice: a valid edge's pulse (whose loads the descriptor's credits
        # wait on) enables neither
        with m.If(edge_go & edge_in.payload.weighs):
            m.d.sync += held_weight.eq(edge_in.payload.weight.as_signed())
        with m.If(edge_go & edge_in.payload.counts):
            m.d.sync += node_count.eq(node_count + 1)
        m.d.comb += [desc.weight.eq(Mux(use_weights, held_weight, 1)), desc.last.eq(s_close),
                     desc.empty.eq(s_close & ~held), desc.count.eq(node_count)]
        self._credits(m, Signal(range(self.row_slots + 1), init=self.row_slots), row_room,
                      self.rows.valid, self.row_done)
        self._credits(m, Signal(range(self.desc_slots + 1), init=self.desc_slots), can_emit,
                      emit, self.desc_done)
        return m

    def _edge_slice(self, m):
        """An edge (its index and, with use_weights, its weight) passes a register slice of
        the walk's own, which joins the two streams and compares the index with the node
        count on the way in: the walk's decisions start from its valid flip-flop, the
        compare's carry chain is not behind them. Beside ``ok`` (index < N) the edge
        carries whether its weight is kept (``weighs``: ok, with use_weights) and whether it
        is counted (``counts``: ok, with count_edges)."""
        use_weights, wts = self.use_weights, self.weights
        m.submodules.edge_slice = edge_slice = StreamRegister(
            data.StructLayout({"index": 32, "ok": 1, "weighs": 1, "counts": 1, "weight": self.ew}))
        ok = self.indices.payload < self.num_nodes
        m.d.comb += [edge_slice.i.valid.eq(self.indices.valid & (wts.valid | ~use_weights)),
                     edge_slice.i.payload.index.eq(self.indices.payload),
                     edge_slice.i.payload.ok.eq(ok),
                     edge_slice.i.payload.weighs.eq(ok & use_weights),
                     edge_slice.i.payload.counts.eq(ok & self.count_edges),
                     edge_slice.i.payload.weight.eq(wts.payload),
                     self.indices.ready.eq(edge_slice.i.ready & (wts.valid | ~use_weights)),
                     wts.ready.eq(edge_slice.i.ready & self.indices.valid & use_weights)]
        return edge_slice.o

    @staticmethod
    def _last_node(m, num_nodes, step):
        """Whether the current node is the last (node + 1 == N), from flip-flops: both
        compares are registered every cycle (they keep running while the datapath is held
        in reset). The counters move a cycle after a ``step`` (from a flip-flop: the late
        step enables none of their bits), and the compare of node + 2 is chosen in the two
        cycles after it, until the compare of the moved node + 1 is registered (steps are
        at least two cycles apart: CLOSE, NEXT_PTR)."""
        node_next = Signal(32, init=1)  # the current node + 1 (compared, never added)
        node_next2 = Signal(32, init=2)  # node_next + 1, counted beside it
        last_now, last_after_step = Signal(reset_less=True), Signal(reset_less=True)
        stepped, stepped2 = Signal(), Signal()
        m.d.sync += [last_now.eq(node_next == num_nodes),
                     last_after_step.eq(node_next2 == num_nodes),
                     stepped.eq(step), stepped2.eq(stepped)]
        with m.If(stepped):
            m.d.sync += [node_next.eq(node_next2), node_next2.eq(node_next2 + 1)]
        return Mux(stepped | stepped2, last_after_step, last_now)

    @staticmethod
    def _credits(m, credits, room, take, give):
        """``credits`` down on ``take``, up on ``give``, and ``room`` (credits != 0) a cycle
        ahead: the counter's +1 and -1 come from its flip-flops, ``take`` (the walk's
        deepest decision) only chooses among them."""
        m.d.sync += [credits.eq(Mux(take & ~give, credits - 1,
                                    Mux(~take & give, credits + 1, credits))),
                     room.eq(Mux(take & ~give, credits != 1,
                                 Mux(~take & give, 1, credits != 0)))]
