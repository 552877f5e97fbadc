"""The read side of hw/dma.py in Amaranth simulation: StreamReaders behind a ReadPort, with
and without its registered request slices, against a byte-array memory with random AR
back-pressure, R gaps and latency, and random element back-pressure. Checks the elements
against memory, the AXI AR rules (valid held with a stable payload until the handshake),
every burst inside its buffer and off 4 KiB boundaries, each client's bursts contiguous in
order (none lost or repeated), R never needing back-pressure, and the guard's fault."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.sim import Simulator

from gnnweave.hw.axi import AXI4Signature
from gnnweave.hw.dma import ReadPort, StreamReader

DATA_WIDTH = 64
BPB = DATA_WIDTH // 8
MEM_BYTES = 3 * 4096
# (base, element bits, count): the first starts below a 4 KiB boundary so it is split there
STREAMS = [(4096 - 5 * BPB, 32, 150), (2 * 4096 + 3 * BPB, 16, 77)]


class Readers(Elaboratable):
    def __init__(self, registered: bool, zero_flag: bool = False):
        self.bus = AXI4Signature(addr_width=32, data_width=DATA_WIDTH, id_width=2).create()
        self.port = ReadPort(self.bus, num_clients=len(STREAMS), registered_requests=registered,
                             zero_flag=zero_flag)
        self.readers = [StreamReader(addr_width=32, data_width=DATA_WIDTH, elem_width=ew,
                                     fifo_beats=8, max_burst=4) for _, ew, _ in STREAMS]

    def elaborate(self, platform):
        m = Module()
        m.submodules.port = self.port
        for i, reader in enumerate(self.readers):
            m.submodules[f"reader{i}"] = reader
            req = self.port.requests[i]
            m.d.comb += [req.valid.eq(reader.request.valid), req.payload.eq(reader.request.payload),
                         reader.request.ready.eq(req.ready), reader.response.eq(self.port.responses[i])]
        return m


def _run_readers(registered: bool, seed: int, *, shrink_guard: int = 0, cycles: int = 6000,
                 zero_flag: bool = False):
    rng = np.random.default_rng(seed)
    memory = rng.integers(0, 256, size=MEM_BYTES, dtype=np.uint8)
    dut = Readers(registered, zero_flag)
    bus, port = dut.bus, dut.port
    guards = []
    for base, ew, count in STREAMS:
        size = -(-count * ew // 8 // BPB) * BPB
        guards.append((base, size))
    guards[-1] = (guards[-1][0], guards[-1][1] - shrink_guard)
    got = [[] for _ in STREAMS]
    bursts = [[] for _ in STREAMS]
    log = {"faults": 0, "done": False, "zero_cycles": 0, "zero_rises": 0}

    async def bench(ctx):
        for i, (base, size) in enumerate(guards):
            ctx.set(port.guard_base[i], base)
            ctx.set(port.guard_size[i], size)
        await ctx.tick()
        for reader, (base, _, count) in zip(dut.readers, STREAMS):
            ctx.set(reader.start, 1)
            ctx.set(reader.base, base)
            ctx.set(reader.count, count)
        await ctx.tick()
        for reader in dut.readers:
            ctx.set(reader.start, 0)
        pending = deque()            # (release cycle, id, data, last)
        held = None                  # AR payload seen valid and not accepted
        for cycle in range(cycles):
            ctx.set(bus.arready, int(rng.random() < 0.6))
            if pending and pending[0][0] <= cycle and rng.random() < 0.7:
                _, rid, rdata, rlast = pending.popleft()
                ctx.set(bus.rvalid, 1)
                ctx.set(bus.rid, rid)
                ctx.set(bus.rdata, rdata)
                ctx.set(bus.rlast, rlast)
            else:
                ctx.set(bus.rvalid, 0)
            for reader in dut.readers:
                ctx.set(reader.elements.ready, int(rng.random() < 0.7))
            assert ctx.get(bus.rready) == 1
            ar = (ctx.get(bus.araddr), ctx.get(bus.arlen), ctx.get(bus.arid))
            # beats granted and not returned before this cycle, from the bus alone: those
            # still to come, the one presented now, and the burst in the AR register
            in_flight = (len(pending) + ctx.get(bus.rvalid) +
                         (ar[1] + 1 if ctx.get(bus.arvalid) else 0))
            if held is not None:
                assert ctx.get(bus.arvalid) == 1 and ar == held, f"cycle {cycle}: AR dropped"
            held = None
            if ctx.get(bus.arvalid):
                if ctx.get(bus.arready):
                    addr, length, rid = ar
                    beats = length + 1
                    base, size = guards[rid]
                    assert base <= addr and addr + beats * BPB <= base + size, (cycle, ar)
                    assert addr // 4096 == (addr + beats * BPB - 1) // 4096, (cycle, ar)
                    bursts[rid].append((addr, beats))
                    for b in range(beats):
                        start = addr + b * BPB
                        word = int.from_bytes(memory[start:start + BPB].tobytes(), "little")
                        pending.append((cycle + 1 + int(rng.integers(0, 12)), rid, word,
                                        int(b == length)))
                else:
                    held = ar
            log["faults"] += ctx.get(port.fault)
            if zero_flag:
                zero = in_flight == 0
                assert ctx.get(port.no_outstanding) == zero, f"cycle {cycle}: zero flag"
                log["zero_rises"] += zero and not log.get("was_zero", True)
                log["zero_cycles"] += zero
                log["was_zero"] = zero
            for i, reader in enumerate(dut.readers):
                if ctx.get(reader.elements.valid) and ctx.get(reader.elements.ready):
                    got[i].append(ctx.get(reader.elements.payload))
            if all(ctx.get(r.done) for r in dut.readers) and not pending:
                log["done"] = True
                break
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return memory, got, bursts, log


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_stream_readers_deliver_memory_under_backpressure(registered, seed):
    memory, got, bursts, log = _run_readers(registered, seed)
    assert log["done"] and log["faults"] == 0
    for (base, ew, count), elems, client_bursts in zip(STREAMS, got, bursts):
        want = memory[base:base + count * ew // 8].view(np.uint32 if ew == 32 else np.uint16)
        assert elems == [int(v) for v in want]
        # bursts contiguous from the base, in order: none lost, none repeated
        addr = base
        for burst_addr, beats in client_bursts:
            assert burst_addr == addr
            addr += beats * BPB
        assert addr == base + -(-count * ew // 8 // BPB) * BPB
    assert any(b[0] % 4096 == 0 for b in bursts[0])   # the boundary split happened


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("seed", [4, 5])
def test_zero_flag_is_outstanding_zero_every_cycle(registered, seed):
    """``no_outstanding`` (``zero_flag``) is high exactly when no beat is in flight, counted
    from the bus (in the AR register, sent and not yet returned), in every cycle, through
    grants, R beats and both at once; the count drains to zero more than once in the run."""
    memory, got, bursts, log = _run_readers(registered, seed, zero_flag=True)
    assert log["done"] and log["faults"] == 0
    assert log["zero_rises"] >= 2


@pytest.mark.parametrize("registered", [False, True])
def test_a_burst_outside_its_buffer_is_refused_with_a_fault(registered):
    memory, got, bursts, log = _run_readers(registered, 3, shrink_guard=BPB, cycles=600)
    assert not log["done"] and log["faults"] > 0
    base, size = STREAMS[1][0], -(-STREAMS[1][2] * 2 // BPB) * BPB - BPB
    assert all(addr + beats * BPB <= base + size for addr, beats in bursts[1])


def test_registered_slices_pass_one_request_per_cycle():
    bus = AXI4Signature(addr_width=32, data_width=DATA_WIDTH, id_width=2).create()
    port = ReadPort(bus, num_clients=2, registered_requests=True)
    fired = []

    async def bench(ctx):
        ctx.set(port.guard_size[1], 4096)
        ctx.set(bus.arready, 1)
        await ctx.tick()
        addr = 0
        for cycle in range(40):
            ctx.set(port.requests[1].valid, 1)
            ctx.set(port.requests[1].payload.addr, addr)   # one-beat bursts, back to back
            if ctx.get(port.requests[1].ready):
                addr += BPB
            if ctx.get(bus.arvalid):
                fired.append(ctx.get(bus.araddr))
            await ctx.tick()

    sim = Simulator(port)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # after the request pipeline fills (a few cycles), one burst every cycle
    assert fired == [i * BPB for i in range(len(fired))] and len(fired) >= 40 - 6
