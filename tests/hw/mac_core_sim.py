"""One MacCore run in the Amaranth simulator, shared by the MacCore tests."""
from __future__ import annotations


async def run_core(ctx, core, settings, out, *, max_cycles: int = 100_000) -> int:
    """Set a :class:`~gnnweave.hw.mac.MacCore`'s start-time inputs (``settings``: pairs of
    signal and value), pulse ``start`` with ``out.ready`` held high, and write every output
    element into ``out[row, col]`` until ``done``, which returns (the next run may start in
    the following cycle). Returns the output beats."""
    for sig, value in settings:
        ctx.set(sig, value)
    ctx.set(core.start, 1)
    ctx.set(core.out.ready, 1)
    await ctx.tick()
    ctx.set(core.start, 0)
    beats = 0
    for _ in range(max_cycles):
        if ctx.get(core.out.valid):
            payload = ctx.get(core.out.payload)
            beats += 1
            for c in range(payload.count):
                out[payload.row, payload.col + c] = payload.data[c]
        done = ctx.get(core.done)
        await ctx.tick()
        if done:
            return beats
    raise AssertionError(f"MacCore did not finish a run in {max_cycles} cycles")
