"""The Aggregator's edge walk (the register slices in front of it are
:class:`~.blocks.StreamRegister`, importable from here too)."""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from .blocks import StreamRegister  # noqa: F401  (importable from here too)


def descriptor_layout(elem_width: int) -> data.StructLayout:
    """One gathered row's instructions for the reduce: its weight, whether it is its
    node's last (``empty``: the node had no valid edge, no row goes with it) and, on the
    last, the node's valid edges."""
    return data.StructLayout({"weight": signed(elem_width), "last": 1, "empty": 1, "count": 32})


class _EdgeState(enum.Enum, shape=3):
    FIRST_PTR = 0   # read indptr[0]
    SKIP = 1        # discard stream positions before the next node's first edge
    NEXT_PTR = 2    # read indptr[v+1]
    EDGES = 3       # walk node v's edges
    CLOSE = 4       # emit node v's last descriptor
    TAIL = 5        # discard positions after the last node
    DONE = 6


class EdgeWalk(wiring.Component):
    """Walks the CSR: one row index and one descriptor per valid edge, node by node.

    Node ``v`` owns stream positions ``[p(v), p(v+1))`` of the clamped row pointers
    ``p(v) = min(max(indptr[v], p(v-1)), E)`` (``p(-1) = 0``); positions before ``p(0)``
    and after ``p(N)`` are read and discarded. An index ``>= N`` is skipped and counted.
    A descriptor leaves one edge late, when it is known whether that edge is its node's
    last; a node without valid edges gets one ``empty`` descriptor.

    Ports:
        pointers, indices, weights: the metadata streams (``weights`` only read with
            ``use_weights``; every weight is 1 without). Indices and weights enter
            through a register slice of the walk's own that joins them (each index
            compared with ``num_nodes`` on its way in, so the configuration must hold
            while the walk runs); ``weights`` still needs a slice in front (it is read
            only when an index is there too), as ``pointers`` does.
        rows: the source index of every valid edge; never refused: the walk holds
            ``row_slots`` credits, one returned by each ``row_done`` pulse.
        descriptors: likewise, ``desc_slots`` credits returned by ``desc_done``.
        run: the walk may start (it then waits for ``indptr[0]``).
        num_nodes, num_edges, use_weights: the run's configuration.
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
            "edge": Out(1), "rejected": Out(1), "bad_indptr": Out(1), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ew, num_nodes, num_edges, use_weights = self.ew, self.num_nodes, self.num_edges, self.use_weights
        # the state, and flags of it as flip-flops set from the next state (no decode of the
        # state before the streams' ready)
        state, state_next = Signal(_EdgeState), Signal(_EdgeState)
        in_edges, in_skip = Signal(), Signal()     # EDGES; SKIP or TAIL
        m.d.comb += state_next.eq(state)
        m.d.sync += [state.eq(state_next), in_edges.eq(state_next == _EdgeState.EDGES),
                     in_skip.eq((state_next == _EdgeState.SKIP) | (state_next == _EdgeState.TAIL))]
        node_next = Signal(32, init=1)  # the current node + 1 (compared, never added)
        node_next2 = Signal(32, init=2)  # node_next + 1, counted beside it
        # node_next == num_nodes as a flip-flop: compares registered every cycle (they keep
        # running while the datapath is held in reset), the one of node_next + 1 chosen in
        # the cycle after a step (steps are at least two cycles apart: CLOSE, NEXT_PTR)
        last_now = Signal(reset_less=True)
        last_after_step = Signal(reset_less=True)
        stepped = Signal()
        m.d.sync += [last_now.eq(node_next == num_nodes),
                     last_after_step.eq(node_next2 == num_nodes), stepped.eq(0)]
        last_node = Mux(stepped, last_after_step, last_now)
        pos = Signal(32)
        pos_next = Signal(32, init=1)   # pos + 1, counted beside it
        pos_next2 = Signal(32, init=2)  # pos + 2, likewise
        target = Signal(32)             # end of the current node (or of the skip)
        node_count = Signal(32)         # valid edges of the current node
        held = Signal()                 # a valid edge waiting to learn whether it is last
        held_weight = Signal(signed(ew), reset_less=True)
        row_credits = Signal(range(self.row_slots + 1), init=self.row_slots)
        desc_credits = Signal(range(self.desc_slots + 1), init=self.desc_slots)
        # flip-flops that say what a compare of counters would: pos == target,
        # pos + 1 == target, room for a row and for a descriptor (each set a cycle ahead from
        # each way its counters can go)
        at_target = Signal(init=1)
        at_last = Signal()
        row_room = Signal(init=self.row_slots != 0)
        can_emit = Signal(init=self.desc_slots != 0)
        emit, desc = self.descriptors.valid, self.descriptors.payload

        ptr, wts = self.pointers, self.weights
        # an edge (its index and, with use_weights, its weight) passes a register slice of
        # the walk's own, which joins the two streams and compares the index with the node
        # count on the way in: the walk's decisions start from its valid flip-flop, the
        # compare's carry chain is not behind them
        m.submodules.edge_slice = edge_slice = StreamRegister(
            data.StructLayout({"index": 32, "ok": 1, "weight": ew}))
        joined = self.indices.valid & (wts.valid | ~use_weights)
        m.d.comb += [edge_slice.i.valid.eq(joined),
                     edge_slice.i.payload.index.eq(self.indices.payload),
                     edge_slice.i.payload.ok.eq(self.indices.payload < num_nodes),
                     edge_slice.i.payload.weight.eq(Mux(use_weights, wts.payload, 1)),
                     self.indices.ready.eq(edge_slice.i.ready & (wts.valid | ~use_weights)),
                     wts.ready.eq(edge_slice.i.ready & self.indices.valid & use_weights)]
        edge_in = edge_slice.o
        edge_ready = edge_in.valid
        weight_in = edge_in.payload.weight.as_signed()
        index_ok = edge_in.payload.ok
        consume = Signal()
        m.d.comb += [consume.eq(edge_ready & ((in_skip & ~at_target) |
                                              (in_edges & row_room & can_emit))),
                     edge_in.ready.eq(consume),
                     self.rows.payload.eq(edge_in.payload.index),
                     self.done.eq(state == _EdgeState.DONE)]
        # a pointer is read only where pos == target: min(max(p, pos), E) and whether the
        # node is empty come from comparators side by side, not one after another
        p = ptr.payload
        p_behind, p_beyond = p < target, p > num_edges
        clamped = Signal(32)
        m.d.comb += clamped.eq(Mux(p_behind, target, Mux(p_beyond, num_edges, p)))
        node_empty = (p <= target) | (target == num_edges)

        def step_pos():
            return [pos.eq(pos + 1), pos_next.eq(pos_next + 1), pos_next2.eq(pos_next2 + 1),
                    at_target.eq(at_last), at_last.eq(pos_next2 == target)]

        def to_tail():          # from pos == target: the rest of the stream is discarded
            m.d.comb += state_next.eq(_EdgeState.TAIL)
            return [target.eq(num_edges), at_target.eq(target == num_edges),
                    at_last.eq(pos_next == num_edges)]

        with m.Switch(state):
            with m.Case(_EdgeState.FIRST_PTR):
                with m.If(self.run & ptr.valid):
                    m.d.comb += [ptr.ready.eq(1), state_next.eq(_EdgeState.SKIP)]
                    # pos is 0 here and target 0, so no pointer lies behind it
                    m.d.sync += [target.eq(clamped),
                                 at_target.eq(Mux(p_beyond, num_edges == 0, p == 0)),
                                 at_last.eq(Mux(p_beyond, num_edges == 1, p == 1))]
                    with m.If(p != 0):
                        m.d.sync += self.bad_indptr.eq(1)
            with m.Case(_EdgeState.SKIP, _EdgeState.TAIL):
                with m.If(at_target):
                    with m.If(state == _EdgeState.TAIL):
                        m.d.comb += state_next.eq(_EdgeState.DONE)
                    with m.Elif(num_nodes == 0):
                        m.d.sync += to_tail()
                    with m.Else():
                        m.d.comb += state_next.eq(_EdgeState.NEXT_PTR)
                with m.Elif(edge_ready):
                    m.d.sync += step_pos()
            with m.Case(_EdgeState.NEXT_PTR):
                with m.If(ptr.valid):
                    m.d.comb += [ptr.ready.eq(1),
                                 state_next.eq(Mux(node_empty, _EdgeState.CLOSE, _EdgeState.EDGES))]
                    # pos == target here: the new target is pos exactly when the node is empty
                    m.d.sync += [target.eq(clamped), node_count.eq(0), at_target.eq(node_empty),
                                 at_last.eq(~p_behind & Mux(p_beyond, pos_next == num_edges,
                                                            pos_next == p))]
                    with m.If(p_behind | p_beyond | (last_node & (p != num_edges))):
                        m.d.sync += self.bad_indptr.eq(1)
            with m.Case(_EdgeState.EDGES):
                with m.If(consume):
                    m.d.sync += step_pos()
                    with m.If(at_last):
                        m.d.comb += state_next.eq(_EdgeState.CLOSE)
                    with m.If(index_ok):
                        m.d.comb += [self.rows.valid.eq(1), self.edge.eq(1)]
                        m.d.sync += [held.eq(1), held_weight.eq(weight_in),
                                     node_count.eq(node_count + 1)]
                        with m.If(held):
                            m.d.comb += [emit.eq(1), desc.weight.eq(held_weight)]
                    with m.Else():
                        m.d.comb += self.rejected.eq(1)
            with m.Case(_EdgeState.CLOSE):
                with m.If(can_emit):
                    m.d.comb += [emit.eq(1), desc.weight.eq(held_weight), desc.last.eq(1),
                                 desc.empty.eq(~held), desc.count.eq(node_count)]
                    m.d.sync += [held.eq(0), node_next.eq(node_next2),
                                 node_next2.eq(node_next2 + 1), stepped.eq(1)]
                    with m.If(last_node):
                        m.d.sync += to_tail()
                    with m.Else():
                        m.d.comb += state_next.eq(_EdgeState.NEXT_PTR)
        self._credits(m, row_credits, row_room, self.rows.valid, self.row_done)
        self._credits(m, desc_credits, can_emit, emit, self.desc_done)
        return m

    @staticmethod
    def _credits(m, credits, room, take, give):
        """``credits`` down on ``take``, up on ``give``, and ``room`` (credits != 0) a cycle
        ahead: the counter's +1 and -1 come from its flip-flops, ``take`` (the walk's
        deepest decision) only chooses among them."""
        m.d.sync += [credits.eq(Mux(take & ~give, credits - 1,
                                    Mux(~take & give, credits + 1, credits))),
                     room.eq(Mux(take & ~give, credits != 1,
                                 Mux(~take & give, 1, credits != 0)))]
