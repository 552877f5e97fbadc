"""Amaranth simulations of a unit core: an AXI4 memory of zeros (the run-control
tests need only its handshakes, not its data) and one job run to its end."""
from __future__ import annotations

from collections import deque


def zero_memory(bus):
    """A process for ``Simulator.add_process``: reads answer zeros, one beat a cycle, in
    order; writes answer OKAY once their AW and WLAST are in."""

    async def memory(ctx):
        reads, aws = deque(), 0
        wlasts = responded = 0
        for sig in (bus.arready, bus.awready, bus.wready):
            ctx.set(sig, 1)
        async for _, _, arvalid, arlen, arid, rvalid, rready, awvalid, wvalid, wlast, bvalid, bready in \
                ctx.tick().sample(bus.arvalid, bus.arlen, bus.arid, bus.rvalid, bus.rready, bus.awvalid,
                                  bus.wvalid, bus.wlast, bus.bvalid, bus.bready):
            if arvalid:
                reads.append([arid, arlen + 1])
            if rvalid and rready:
                reads[0][1] -= 1
                if reads[0][1] == 0:
                    reads.popleft()
            aws += awvalid
            wlasts += wvalid and wlast
            responded += bvalid and bready
            ctx.set(bus.rvalid, bool(reads))
            if reads:
                ctx.set(bus.rid, reads[0][0])
                ctx.set(bus.rlast, reads[0][1] == 1)
            ctx.set(bus.bvalid, min(aws, wlasts) > responded)

    return memory


async def run_job(ctx, core, regs: dict, *, each_cycle=None, timeout: int = 20_000) -> int:
    """Write ``regs`` to ``core.cfg``, pulse ``start`` and wait for ``done``; returns the
    status register. ``each_cycle(ctx)`` runs every cycle of the wait (to poke the run)."""
    for name, value in regs.items():
        ctx.set(core.cfg[name], value)
    ctx.set(core.start, 1)
    await ctx.tick()
    ctx.set(core.start, 0)
    for _ in range(timeout):
        if each_cycle is not None:
            each_cycle(ctx)
        if ctx.get(core.done):
            status = ctx.get(core.stat["status"])
            await ctx.tick()
            return status
        await ctx.tick()
    raise AssertionError(f"no done within {timeout} cycles")
