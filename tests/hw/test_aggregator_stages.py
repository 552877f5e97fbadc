"""The Aggregator's pipeline stages alone (Amaranth simulation), bit-exact against
:mod:`gnnweave.fixed` / the golden model's narrowing and against plain integer products."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Signal, signed, unsigned
from amaranth.sim import Simulator

from gnnweave.fixed import MEAN_RECIP_BITS, MEAN_SUM_WIDTH, FixedFormat, mean_reciprocal, narrow
from gnnweave.hw.aggregator_output import OutputStage
from gnnweave.hw.arith import (ECP5_TILE, PipelinedMultiplier, fabric_multiplier_tile,
                               fabric_products)


def _run(dut, bench, clock=True):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def _multiply(dut, a_values, b_values, enables=None):
    """Drive a :class:`PipelinedMultiplier` with one operand pair per cycle (and ``en`` from
    ``enables``, 0 once they run out); returns ``p`` after each of the ``len(a_values) +
    latency`` edges."""
    seen = []

    async def bench(ctx):
        for t in range(len(a_values) + dut.latency):
            if t < len(a_values):
                ctx.set(dut.a, a_values[t])
                ctx.set(dut.b, b_values[t])
            if enables is not None:
                ctx.set(dut.en, enables[t] if t < len(enables) else 0)
            await ctx.tick()
            seen.append(ctx.get(dut.p))

    _run(dut, bench)
    return seen


@pytest.mark.parametrize("tile", [None, ECP5_TILE])
@pytest.mark.parametrize("a_shape, b_shape", [
    (signed(32), unsigned(25)), (unsigned(32), unsigned(32)), (signed(16), signed(16)),
    (signed(40), signed(20)), (signed(44), unsigned(26))])
def test_pipelined_multiplier_matches_integer_products(a_shape, b_shape, tile):
    """The same products at the same latency whatever the fabric's multiplier tile."""
    with fabric_multiplier_tile(tile):
        _check_products(a_shape, b_shape)


def _check_products(a_shape, b_shape):
    dut = PipelinedMultiplier(a_shape, b_shape)
    rng = np.random.default_rng(a_shape.width * 100 + b_shape.width)

    def draw(shape, n):
        lo = -(1 << (shape.width - 1)) if shape.signed else 0
        hi = (1 << (shape.width - 1)) if shape.signed else (1 << shape.width)
        edges = [lo, hi - 1, 0, 1, -1 if shape.signed else hi // 2]
        return edges + [int(v) for v in rng.integers(lo, hi, size=n, dtype=np.int64)]

    a_values, b_values = draw(a_shape, 40), draw(b_shape, 40)
    n = min(len(a_values), len(b_values))
    seen = _multiply(dut, a_values[:n], b_values[:n])
    assert seen[dut.latency - 1:dut.latency - 1 + n] == [a * b for a, b in zip(a_values, b_values)]
    assert dut.tiles == {(32, 25): 2, (32, 32): 4, (16, 16): 1, (40, 20): 3, (44, 26): 3}[
        (a_shape.width, b_shape.width)]
    assert dut.latency == 3 + (dut.tiles - 1).bit_length()


@pytest.mark.parametrize("a_shape, b_shape, pieces", [
    (signed(27), signed(18), 2), (unsigned(26), unsigned(17), 2), (signed(18), signed(18), 1),
    (signed(27), unsigned(18), 4)])
def test_fabric_products_fit_the_ecp5_multiplier(a_shape, b_shape, pieces):
    """Under the ECP5 tile each piece is one 18 x 18 signed multiplier's product."""
    a, b = Signal(a_shape), Signal(b_shape)
    with fabric_multiplier_tile(ECP5_TILE):
        got = fabric_products(a, b)
    assert len(got) == pieces
    assert all(p.shape().width <= 36 for _, p in got)
    assert len(fabric_products(a, b)) == 1          # no fabric tile: the DSP48E2's product


def test_fabric_tile_is_checked():
    with pytest.raises(ValueError, match="multiplier tile"):
        with fabric_multiplier_tile((1, 18)):
            pass


@pytest.mark.parametrize("tile", [None, ECP5_TILE])
@pytest.mark.parametrize("a_shape, b_shape", [(signed(32), unsigned(25)),
                                              (unsigned(32), unsigned(32))])
def test_pipelined_multiplier_with_enable_holds_still_between_operands(a_shape, b_shape, tile):
    """With ``enable``, a product comes ``latency`` cycles after each ``en`` and ``p``
    keeps its value on every cycle no product is due (the stages load only behind ``en``)."""
    rng = np.random.default_rng(7 + a_shape.width)
    n = 120
    lo = -(1 << (a_shape.width - 1)) if a_shape.signed else 0
    a_values = [int(v) for v in rng.integers(lo, lo + (1 << a_shape.width), size=n, dtype=np.int64)]
    b_values = [int(v) for v in rng.integers(0, 1 << b_shape.width, size=n, dtype=np.int64)]
    enables = [int(v) for v in rng.random(n) < 0.3]
    with fabric_multiplier_tile(tile):
        dut = PipelinedMultiplier(a_shape, b_shape, enable=True)
        seen = _multiply(dut, a_values, b_values, enables)
    due = {t + dut.latency - 1: a_values[t] * b_values[t] for t in range(n) if enables[t]}
    assert len(due) > 20
    for k in range(len(seen)):
        if k in due:
            assert seen[k] == due[k], k
        elif k > 0 and any(d < k for d in due):
            assert seen[k] == seen[k - 1], k


LANES, ACC_W, EW = 4, 64, 16


def _oracle(acc, shift, degree, mean, mask):
    """What the golden model gives one beat: (outputs, saturated lanes)."""
    acc = np.asarray(acc, dtype=np.int64)
    out_fmt = FixedFormat(EW, 0)
    if mean:
        s, sat1 = narrow(acc, shift, FixedFormat(MEAN_SUM_WIDTH, 0))
        y, sat2 = narrow(s * int(mean_reciprocal(degree)), MEAN_RECIP_BITS, out_fmt)
        sat = sat1 | sat2
    else:
        y, sat = narrow(acc, shift, out_fmt)
    if degree == 0:
        y, sat = np.zeros_like(y), np.zeros_like(sat)
    sat = sat & np.array(mask, dtype=bool)
    return [int(v) & 0xFFFF for v in y], int(np.count_nonzero(sat))


def _beats(rng, n, max_scale=62, max_shift=64):
    beats = []
    for _ in range(n):
        scale = int(rng.integers(0, max_scale))
        acc = [int(v) for v in rng.integers(-(1 << scale), (1 << scale) + 1, size=LANES)]
        if rng.random() < 0.2:   # an exact half: rounds to the even neighbour
            shift = int(rng.integers(1, min(40, max_shift)))
            acc[0] = (2 * int(rng.integers(-1000, 1000)) + 1) << (shift - 1)
        else:
            shift = int(rng.integers(0, max_shift))
        degree = int(rng.choice([0, 1, 2, 3, 7, 100, 65535, 1 << 20]))
        mask = [bool(b) for b in rng.integers(0, 2, size=LANES)]
        beats.append((acc, shift, degree, mask, bool(rng.integers(0, 2))))
    return beats


def _halves(acc, rng, op="sum"):
    """``acc`` and ``single`` of an accumulator beat whose lanes combine to ``acc``: a random
    split of each sum (wrapping at ACC_W), for max the value beside a smaller one (both
    of a product's width, as every accumulator of a max run), either half; or, as for a
    node with one edge, ``acc`` in the even half beside anything."""
    bits = (1 << ACC_W) - 1
    single = bool(rng.random() < 0.2)
    even, odd = [], []
    for a in acc:
        if single:
            pair = [a, int(rng.integers(-(1 << 62), 1 << 62))]
        elif op == "max":
            pair = [a, int(rng.integers(-(1 << (2 * EW - 1)), a + 1))]
            if rng.random() < 0.5:
                pair.reverse()
        else:
            part = int(rng.integers(-(1 << 62), 1 << 62))
            pair = [a - part, part]
        even.append(pair[0] & bits)
        odd.append(pair[1] & bits)
    return {"acc": sum(v << (ACC_W * k) for k, v in enumerate(even + odd)), "single": single}


@pytest.mark.parametrize("mean, op", [(True, "sum"), (False, "sum"), (False, "max")])
def test_output_stage_narrows_like_the_golden_model(mean, op):
    """One beat a cycle, back to back (and with gaps), every lane and its saturation count;
    the shift changes between beats here, so each beat waits for its registered constants.
    Each lane arrives as two partial accumulators, combined first."""
    dut = OutputStage(lanes=LANES, acc_width=ACC_W, elem_width=EW, mean=mean)
    rng = np.random.default_rng(7 + mean + 2 * (op == "max"))
    # a max run's accumulators are products (or the least one, the identity)
    beats = _beats(rng, 120, 2 * EW - 1, 20) if op == "max" else _beats(rng, 120)
    got, counts = [], []

    async def bench(ctx):
        ctx.set(dut.mean, mean)
        ctx.set(dut.max, op == "max")
        for acc, shift, degree, mask, last in beats:
            ctx.set(dut.shift, shift)
            ctx.set(dut.i.valid, 0)
            await ctx.tick()          # the registered rounding constants follow the shift
            payload = {**_halves(acc, rng, op),
                       "mask": sum(b << k for k, b in enumerate(mask)), "last": last,
                       "zero": degree == 0, "recip": int(mean_reciprocal(degree)) if degree else 0}
            ctx.set(dut.i.payload, payload)
            ctx.set(dut.i.valid, 1)
            await ctx.tick()
            ctx.set(dut.i.valid, 0)
            for _ in range(dut.latency - 1):
                assert not ctx.get(dut.o.valid)
                await ctx.tick()
            assert ctx.get(dut.o.valid) and ctx.get(dut.busy)
            out = ctx.get(dut.o.payload)
            got.append(([(out.data >> (EW * k)) & 0xFFFF for k in range(LANES)],
                        out.strb, out.last))
            await ctx.tick()
            assert ctx.get(dut.busy) and ctx.get(dut.saturated) == 0
            await ctx.tick()        # the count two cycles after its beat
            counts.append(ctx.get(dut.saturated))
            await ctx.tick()
            assert not ctx.get(dut.busy) and ctx.get(dut.saturated) == 0

    _run(dut, bench)
    for (acc, shift, degree, mask, last), (values, strb, got_last), count in zip(beats, got, counts):
        want, want_count = _oracle(acc, shift, degree, mean, mask)
        assert values == want, (acc, shift, degree)
        assert count == want_count, (acc, shift, degree, mask)
        assert strb == sum(0b11 << (2 * k) for k, b in enumerate(mask) if b)
        assert got_last == last
    assert sum(counts) > 10 and any(c == 0 for c in counts)


def test_output_stage_takes_a_beat_every_cycle():
    dut = OutputStage(lanes=LANES, acc_width=ACC_W, elem_width=EW, mean=True)
    rng = np.random.default_rng(3)
    beats = [b for b in _beats(rng, 60)]
    shift = 9
    got, counts = [], []

    async def bench(ctx):
        ctx.set(dut.mean, 1)
        ctx.set(dut.shift, shift)
        await ctx.tick()
        for t in range(len(beats) + dut.latency + 2):
            if t < len(beats):
                acc, _, degree, mask, last = beats[t]
                ctx.set(dut.i.payload, {
                    **_halves(acc, rng),
                    "mask": sum(b << k for k, b in enumerate(mask)), "last": last,
                    "zero": degree == 0, "recip": int(mean_reciprocal(degree)) if degree else 0})
            ctx.set(dut.i.valid, t < len(beats))
            await ctx.tick()
            if ctx.get(dut.saturated) or got:
                counts.append(ctx.get(dut.saturated))
            if ctx.get(dut.o.valid):
                out = ctx.get(dut.o.payload)
                got.append([(out.data >> (EW * k)) & 0xFFFF for k in range(LANES)])

    _run(dut, bench)
    assert len(got) == len(beats)
    want = [_oracle(acc, shift, degree, True, mask) for acc, _, degree, mask, _ in beats]
    assert got == [w for w, _ in want]
    assert sum(counts) == sum(c for _, c in want)


# ---------------------------------------------------------------- configuration check
from gnnweave.hw.aggregator import CONFIG_REGISTERS  # noqa: E402
from gnnweave.hw.aggregator_check import ConfigCheck  # noqa: E402

BPB, CHECK_LANES, MAX_F = 16, 8, 256


def _refused(r, aw=64):
    """The configuration contract (the check's docstring), in plain integers."""
    n, e, f = r["num_nodes"], r["num_edges"], r["feat_dim"]
    w = r["use_weights"] & 1
    row = -(-f // CHECK_LANES) * BPB

    def whole(nbytes):
        return -(-nbytes // BPB) * BPB

    need = {"indptr": whole(4 * (n + 1)), "indices": whole(4 * e), "weights": whole(2 * e),
            "feat": (n - 1) * r["feat_stride"] + row, "out": (n - 1) * r["out_stride"] + row}
    used = {"indptr": True, "indices": True, "weights": w, "feat": n != 0, "out": n != 0}
    bad = [f == 0 or f > MAX_F, r["reduce_op"] not in (0, 1, 2), r["shift"] > 63,
           n == 0xFFFF_FFFF, r["feat_stride"] % BPB != 0, r["out_stride"] % BPB != 0,
           n != 0 and (r["feat_stride"] < row or r["out_stride"] < row)]
    for name in need:
        addr, size = r[f"{name}_addr"], r[f"{name}_size"]
        if name != "weights" or w:
            bad.append(addr % BPB != 0)
        if used[name]:
            bad += [size < need[name], (addr + size) >> aw != 0]
    return any(bad)


def _configs(rng, count):
    good = {"num_nodes": 5, "num_edges": 9, "feat_dim": 20, "reduce_op": 1, "use_weights": 1,
            "shift": 8, "feat_stride": 48, "out_stride": 64,
            "indptr_addr": 0x1000, "indptr_size": 32, "indices_addr": 0x2000, "indices_size": 48,
            "weights_addr": 0x3000, "weights_size": 32, "feat_addr": 0x4000, "feat_size": 4 * 48 + 48,
            "out_addr": 0x8000, "out_size": 4 * 64 + 48}
    yield good
    widths = {name: width for name, width, _ in CONFIG_REGISTERS}
    for _ in range(count):
        r = dict(good)
        for name in rng.choice(list(r), size=int(rng.integers(1, 3)), replace=False):
            top = (1 << widths[name]) - 1
            r[name] = int(rng.choice([0, 1, top, top - 15, r[name] + int(rng.integers(-20, 20)),
                                      r[name] * int(rng.integers(1, 40)), int(rng.integers(0, 1 << 20))]))
            r[name] = min(max(r[name], 0), top)
        yield r
    big = dict(good, num_nodes=1 << 20, feat_stride=1 << 24, feat_size=(1 << 44) + 48,
               out_stride=64, out_size=(1 << 26) * 1)
    yield big
    yield dict(big, feat_size=((1 << 20) - 1) * (1 << 24) + 47)        # one byte short
    yield dict(big, feat_size=((1 << 20) - 1) * (1 << 24) + 48)
    for aw in (64, 32):
        top = (1 << aw) - 4096
        yield dict(good, out_addr=top, out_size=4095)           # its last byte the space's last
        yield dict(good, out_addr=top, out_size=4096)           # one byte past it: refused
        yield dict(good, out_addr=top, out_size=4096 + 16)
    yield dict(good, indices_size=(1 << 32) + 48)         # past a 32-bit address space alone


@pytest.mark.parametrize("addr_width", [64, 32])
def test_config_check_matches_the_contract(addr_width):
    dut = ConfigCheck(CONFIG_REGISTERS, lanes=CHECK_LANES, bytes_per_beat=BPB, elem_width=16,
                      max_feat_dim=MAX_F, addr_width=addr_width, reduce_codes=(0, 1, 2))
    cases = list(_configs(np.random.default_rng(11), 300))
    verdicts, cycles = [], []

    async def bench(ctx):
        for r in cases:
            for name, value in r.items():
                ctx.set(dut.cfg[name], value)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            t = 0
            while not ctx.get(dut.done):
                await ctx.tick()
                t += 1
                assert t < 50, "the check did not finish"
            cycles.append(t)
            verdicts.append(bool(ctx.get(dut.error)))
            f = r["feat_dim"]
            if 0 < f <= MAX_F:
                beats = -(-f // CHECK_LANES)
                assert ctx.get(dut.row_beats) == beats and ctx.get(dut.row_bytes) == beats * BPB
                assert ctx.get(dut.last_mask) == (1 << (f - (beats - 1) * CHECK_LANES)) - 1

    _run(dut, bench)
    want = [_refused(r, addr_width) for r in cases]
    assert verdicts == want, [r for r, v, w in zip(cases, verdicts, want) if v != w][:3]
    assert 0.2 < sum(want) / len(want) < 0.9            # both verdicts well represented
    assert max(cycles) <= 38 and min(cycles) <= 8       # ends at N - 1's highest set bit


# ---------------------------------------------------------------- row addresses
from gnnweave.hw.aggregator_gather import RowAddress  # noqa: E402


def _bursts(base, stride, index, row_beats, bpb=16):
    """A row's read bursts, split where it crosses a 4 KiB boundary."""
    addr = (base + index * stride) % (1 << 64)
    first = min((4096 - addr % 4096) // bpb, row_beats)
    return addr, first, (addr + first * bpb) % (1 << 64), row_beats - first


def test_row_address_splits_at_4k_boundaries():
    dut = RowAddress(addr_width=64, bytes_per_beat=16, max_beats=32)
    rng = np.random.default_rng(5)
    cases = []
    for _ in range(150):
        stride = 16 * int(rng.choice([1, 2, 3, 33, 255, 256, int(rng.integers(1, 1 << 28))]))
        index = int(rng.choice([0, 1, 0xFFFF_FFFF, int(rng.integers(0, 1 << 32))]))
        base = 16 * int(rng.integers(0, 1 << 40))
        cases.append((base, stride, index, int(rng.integers(1, 33))))
    got = []

    async def bench(ctx):
        for base, stride, index, beats in cases:   # run constants change: one at a time
            ctx.set(dut.base, base)
            ctx.set(dut.stride, stride)
            ctx.set(dut.row_beats, beats)
            ctx.set(dut.i.payload, index)
            ctx.set(dut.i.valid, 1)
            await ctx.tick()
            ctx.set(dut.i.valid, 0)
            for _ in range(dut.latency - 1):
                assert ctx.get(dut.busy) and not ctx.get(dut.o.valid)
                await ctx.tick()
            assert ctx.get(dut.o.valid)
            o = ctx.get(dut.o.payload)
            got.append((o.first_addr, o.first_len, o.second_addr, o.second_len))
            await ctx.tick()
            assert not ctx.get(dut.busy)

    _run(dut, bench)
    want = [_bursts(*c) for c in cases]
    for g, w in zip(got, want):
        assert g[:2] == w[:2] and g[3] == w[3] and (w[3] == 0 or g[2] == w[2]), (g, w)
    assert any(w[3] for w in want) and any(not w[3] for w in want)


# ---------------------------------------------------------------- stream register slice
from gnnweave.hw.aggregator_walk import StreamRegister  # noqa: E402


@pytest.mark.parametrize("p_valid, p_ready", [(1.0, 1.0), (0.7, 0.5), (1.0, 0.3), (0.3, 1.0)])
def test_stream_register_keeps_order_and_rate(p_valid, p_ready):
    dut = StreamRegister(16)
    rng = np.random.default_rng(int(p_valid * 10 + p_ready * 100))
    sent, got = list(range(1, 301)), []
    cycles = []

    async def bench(ctx):
        k, t = 0, 0
        while len(got) < len(sent):
            offer = k < len(sent) and rng.random() < p_valid
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, sent[k] if offer else 0)
            ready_before = ctx.get(dut.i.ready)
            take = rng.random() < p_ready
            ctx.set(dut.o.ready, take)
            assert ctx.get(dut.i.ready) == ready_before      # no path from o.ready to i.ready
            if ctx.get(dut.o.valid) and take:
                got.append(ctx.get(dut.o.payload))
            if offer and ctx.get(dut.i.ready):
                k += 1
            await ctx.tick()
            t += 1
            assert t < 5000
        cycles.append(t)

    _run(dut, bench)
    assert got == sent
    if p_valid == p_ready == 1.0:
        assert cycles[0] <= len(sent) + 2                      # one element per cycle


# ---------------------------------------------------------------- edge walk
from gnnweave.golden.aggregate import effective_indptr  # noqa: E402
from gnnweave.hw.aggregator_walk import EdgeWalk, PointerClamp  # noqa: E402


def _walk_oracle(indptr, indices, weights, n, use_weights=True, count_edges=True):
    """Rows and descriptors the walk must give, from the golden model's row pointers
    (every weight 1 without ``use_weights``, every count 0 without ``count_edges``)."""
    e = len(indices)
    eff, bad = effective_indptr(np.array(indptr), n, e)
    rows, descs = [], []
    for v in range(n):
        valid = [k for k in range(eff[v], eff[v + 1]) if indices[k] < n]
        rows += [indices[k] for k in valid]
        if not valid:
            descs.append((None, 1, 1, 0))
        for j, k in enumerate(valid):
            last = j == len(valid) - 1
            descs.append((weights[k] if use_weights else 1, int(last), 0,
                          (len(valid) if count_edges else 0) if last else None))
    rejected = sum(1 for k in range(eff[0], eff[n]) if indices[k] >= n)
    return rows, descs, bad, rejected


@pytest.mark.parametrize("use_weights, count_edges", [(1, 1), (0, 0)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_edge_walk_follows_the_clamped_pointers(seed, use_weights, count_edges):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    e = int(rng.integers(0, 40))
    indptr = sorted(int(v) for v in rng.integers(0, e + 1, size=n + 1))
    if seed % 2:        # malformed: decreasing, beyond E, not starting at 0
        indptr = [int(v) for v in rng.integers(0, e + 5, size=n + 1)]
    indices = [int(v) for v in rng.integers(0, n + 3, size=e)]
    weights = [int(v) for v in rng.integers(-300, 300, size=e)]
    dut = EdgeWalk(elem_width=16, row_slots=3, desc_slots=4)
    rows, descs, flags = [], [], {"bad": 0, "edges": 0, "rejected": 0}

    async def bench(ctx):
        ctx.set(dut.num_nodes, n)
        ctx.set(dut.num_edges, e)
        ctx.set(dut.use_weights, use_weights)
        ctx.set(dut.count_edges, count_edges)
        ctx.set(dut.run, 1)
        queues = {"pointers": list(indptr), "indices": list(indices), "weights": list(weights)}
        owed_rows, owed_descs = [], []          # credits come back some cycles later
        for t in range(3000):
            for name, q in queues.items():
                port = getattr(dut, name)
                offer = bool(q) and rng.random() < 0.7
                ctx.set(port.valid, offer)
                head = q[0] if q else 0
                ctx.set(port.payload, head & 0xFFFF if name == "weights" else head)
            ctx.set(dut.row_done, bool(owed_rows) and owed_rows[0] <= t)
            ctx.set(dut.desc_done, bool(owed_descs) and owed_descs[0] <= t)
            if owed_rows and owed_rows[0] <= t:
                owed_rows.pop(0)
            if owed_descs and owed_descs[0] <= t:
                owed_descs.pop(0)
            for name, q in queues.items():
                port = getattr(dut, name)
                if ctx.get(port.valid) and ctx.get(port.ready):
                    q.pop(0)
            if ctx.get(dut.rows.valid):
                rows.append(ctx.get(dut.rows.payload))
                owed_rows.append(t + int(rng.integers(1, 6)))
            if ctx.get(dut.descriptors.valid):
                d = ctx.get(dut.descriptors.payload)
                # an empty node's descriptor carries no weight
                descs.append((None if d.empty else d.weight, d.last, d.empty,
                              d.count if d.last else None))
                owed_descs.append(t + int(rng.integers(1, 8)))
            flags["edges"] += ctx.get(dut.edge)
            flags["rejected"] += ctx.get(dut.rejected)
            if ctx.get(dut.done):
                break
            await ctx.tick()
        flags["bad"] = ctx.get(dut.bad_indptr)
        assert ctx.get(dut.done), "the walk did not finish"

    _run(dut, bench)
    want_rows, want_descs, want_bad, want_rejected = _walk_oracle(indptr, indices, weights, n,
                                                                  use_weights, count_edges)
    assert rows == want_rows
    assert descs == want_descs
    assert flags["edges"] == len(want_rows) and flags["rejected"] == want_rejected
    assert bool(flags["bad"]) == want_bad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pointer_clamp_gives_the_golden_bounds_and_flags(seed):
    """Every node's clamped end and flags against the golden model's effective pointers,
    with pointers offered and taken at random; one node's bounds at least every two
    cycles while both sides keep up."""
    rng = np.random.default_rng(100 + seed)
    n, e = int(rng.integers(1, 30)), int(rng.integers(0, 20))
    indptr = [int(v) for v in rng.integers(0, e + 4, size=n + 1)]
    if seed == 0:
        indptr = sorted(min(v, e) for v in indptr)
        indptr[0] = 0
    want, _ = effective_indptr(np.array(indptr), n, e)
    dut = PointerClamp()
    got, taken_at = [], []

    async def bench(ctx):
        ctx.set(dut.num_edges, e)
        ctx.set(dut.run, 1)
        queue = list(indptr)
        for t in range(20 * (n + 1) + 20):
            ctx.set(dut.i.valid, bool(queue) and (seed == 0 or rng.random() < 0.8))
            ctx.set(dut.i.payload, queue[0] if queue else 0)
            ctx.set(dut.o.ready, seed == 0 or rng.random() < 0.6)
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                queue.pop(0)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                node = ctx.get(dut.o.payload)
                got.append({f: int(getattr(node, f)) for f in
                            ("end", "empty", "single", "end_is_last", "end_before_last",
                             "bad", "not_end")})
                taken_at.append(t)
            await ctx.tick()

    _run(dut, bench)
    assert [g["end"] for g in got] == [int(v) for v in want]
    prev = [0] + [int(v) for v in want[:-1]]
    for v, g in enumerate(got):
        assert g["empty"] == (want[v] == prev[v]) and g["single"] == (want[v] == prev[v] + 1)
        assert g["end_is_last"] == (want[v] == e) and g["end_before_last"] == (want[v] == e - 1)
        outside = indptr[v] != 0 if v == 0 else not prev[v] <= indptr[v] <= e
        assert g["bad"] == outside and g["not_end"] == (indptr[v] != e)
    if seed == 0:       # always offered and taken: a node every two cycles
        assert np.all(np.diff(taken_at) == 2)


# ---------------------------------------------------------------- row gather
from gnnweave.hw.aggregator_gather import RowGather  # noqa: E402


@pytest.mark.parametrize("p_ready, p_free", [(1.0, 1.0), (0.5, 0.3), (0.9, 0.1)])
def test_row_gather_issues_every_burst_within_its_credits(p_ready, p_free):
    slots, maxb = 12, 8
    dut = RowGather(addr_width=40, max_beats=maxb, slots=slots)
    rng = np.random.default_rng(int(p_ready * 10 + p_free * 100))
    rows = []
    for _ in range(80):
        first = int(rng.integers(1, maxb + 1))
        second = int(rng.integers(0, maxb - first + 1)) if rng.random() < 0.4 else 0
        rows.append({"first_addr": 16 * int(rng.integers(0, 1 << 30)), "first_len": first,
                     "second_addr": 16 * int(rng.integers(0, 1 << 30)), "second_len": second})
    want = [b for r in rows for b in [(r["first_addr"], r["first_len"] - 1)] +
            ([(r["second_addr"], r["second_len"] - 1)] if r["second_len"] else [])]
    got = []

    async def bench(ctx):
        k, held = 0, 0          # rows offered; beats issued and not yet freed
        for _ in range(4000):
            ctx.set(dut.bursts.valid, k < len(rows))
            ctx.set(dut.bursts.payload, rows[k] if k < len(rows) else rows[0])
            ctx.set(dut.request.ready, rng.random() < p_ready)
            free = held > 0 and rng.random() < p_free
            ctx.set(dut.freed, free)
            held -= free
            if ctx.get(dut.request.valid) and ctx.get(dut.request.ready):
                got.append((ctx.get(dut.request.payload.addr), ctx.get(dut.request.payload.len)))
                held += got[-1][1] + 1
            assert held <= slots, "more beats requested than the row buffer has room for"
            k += ctx.get(dut.bursts.valid) and ctx.get(dut.bursts.ready)
            await ctx.tick()
            if len(got) == len(want):
                break

    _run(dut, bench)
    assert got == want


# ---------------------------------------------------------------- mean reciprocal
from gnnweave.hw.aggregator import ReciprocalPipe  # noqa: E402
from gnnweave.hw.aggregator_walk import descriptor_layout  # noqa: E402


@pytest.mark.parametrize("p_valid", [1.0, 0.3])
def test_reciprocal_pipe_matches_mean_reciprocal(p_valid):
    """Every count (0, 1, the largest, random) comes out once, in order, after exactly
    ``latency`` cycles, with :func:`mean_reciprocal` of it and its descriptor unchanged,
    whether elements come back to back or between idle cycles."""
    dut = ReciprocalPipe(descriptor_layout(16))
    rng = np.random.default_rng(11)
    counts = [0, 1, 2, 3, (1 << 32) - 1, 1 << 24, (1 << 24) + 1,
              *rng.integers(1, 64, 40), *rng.integers(1, 1 << 32, 20, dtype=np.int64)]
    sent, got = [], []

    async def bench(ctx):
        t = 0
        while len(got) < len(counts):
            if len(sent) < len(counts) and rng.random() < p_valid:
                desc = {"weight": int(rng.integers(-(1 << 15), 1 << 15)), "last": len(sent) & 1,
                        "empty": 0, "count": int(counts[len(sent)])}
                ctx.set(dut.i.payload, desc)
                ctx.set(dut.i.valid, 1)
                sent.append((t, desc))
            else:
                ctx.set(dut.i.payload, {"weight": 0, "last": 0, "empty": 1, "count": 7})
                ctx.set(dut.i.valid, 0)
            await ctx.tick()
            t += 1
            if ctx.get(dut.o.valid):
                out = ctx.get(dut.o.payload)
                got.append((t, int(out.recip), int(out.desc.count), int(out.desc.weight)))
            assert t < 10 * len(counts) + dut.latency, "elements lost"

    _run(dut, bench)
    for (t_in, desc), (t_out, recip, count, weight) in zip(sent, got):
        assert t_out - t_in == dut.latency
        assert (count, weight) == (desc["count"], desc["weight"])
        assert recip == int(mean_reciprocal(count)), count
