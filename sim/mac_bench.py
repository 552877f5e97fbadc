"""MacArray bench: the RTL against ``golden/mac.py``, through two front ends.

``front_end="axi"`` (what ``gnnweave verify mac`` runs): the whole AXI top
(:class:`~gnnweave.hw.mac_array.MacArrayTop`: control slave, operand loads from memory,
tiling, write-back) on Verilator under cocotb (:mod:`gnnweave.sim.mac_array_bench`); the
counters cover the run from ap_start to done, loads included.

``front_end="unit"``: :func:`run_mac_rtl` writes the two operand matrices straight into
the :class:`~gnnweave.hw.mac.MacUnit`'s skewed buffers (forward, row-major layout; the
transposes happen on chip), optionally the bias, runs one operation with optional output
back-pressure in the Amaranth simulator (no toolchain), and returns the result and the
compute counters (from loaded buffers).

:func:`verify_mac` draws a random problem, compares with golden bit for bit and returns
the JSON fields of ``gnnweave verify mac``.
"""
from __future__ import annotations

import time

import numpy as np

from gnnweave.errors import InputError
from gnnweave.golden.mac import MacMode, mac


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def operand_shapes(mode, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of the P (A side) and Q (B side) matrices as the host stores them."""
    mode = MacMode.parse(mode)
    if mode is MacMode.FWD:
        return (m, k), (k, n)       # X, W
    if mode is MacMode.DX:
        return (m, k), (n, k)       # dY [M, N_out=k], W [K_in=n, N_out=k]
    return (k, m), (k, n)           # X [rows=k, m], dY [rows=k, n]


async def load_skewed(ctx, buf, mat, lanes: int) -> int:
    """Write ``mat`` into a :class:`~gnnweave.hw.mac.SkewedBuffer` one ``lanes``-wide row
    segment per cycle (Amaranth simulator); returns the writes (beats)."""
    beats = 0
    for i in range(mat.shape[0]):
        for j0 in range(0, mat.shape[1], lanes):
            seg = mat[i, j0:j0 + lanes]
            ctx.set(buf.wr_en, 1)
            ctx.set(buf.wr.row, i)
            ctx.set(buf.wr.col, j0)
            ctx.set(buf.wr.count, len(seg))
            for lane, v in enumerate(seg):
                ctx.set(buf.wr.data[lane], int(v))
            await ctx.tick()
            beats += 1
    ctx.set(buf.wr_en, 0)
    return beats


async def load_bias(ctx, core, bias) -> None:
    """Clear a MacCore's bias register file, then write ``bias`` one element per cycle."""
    ctx.set(core.bias_clear, 1)
    await ctx.tick()
    ctx.set(core.bias_clear, 0)
    for v in bias:
        ctx.set(core.bias_wr_en, 1)
        ctx.set(core.bias_wr_data, int(v))
        await ctx.tick()
    ctx.set(core.bias_wr_en, 0)


def run_mac_rtl(mode, p_mat, q_mat, *, shift: int, relu: bool = False, bias=None,
                bias_shift: int = 0, array_rows: int = 4, array_cols: int = 4,
                ready_pattern=None, out_width: int = 16, max_cycles: int = 5_000_000,
                core_options: dict | None = None) -> dict:
    """Run one operation on a :class:`~gnnweave.hw.mac.MacUnit` in the Amaranth simulator
    (``core_options``: further :class:`~gnnweave.hw.mac.MacCore` options) and return the
    output, its ReLU mask and the core's counters."""
    from amaranth.sim import Simulator

    from gnnweave.hw.mac import MacMode as HwMode
    from gnnweave.hw.mac import MacUnit

    mode = MacMode.parse(mode)
    p_mat, q_mat = np.asarray(p_mat, np.int64), np.asarray(q_mat, np.int64)
    if mode is MacMode.FWD:
        mm, nn, kk = p_mat.shape[0], q_mat.shape[1], p_mat.shape[1]
    elif mode is MacMode.DX:
        mm, nn, kk = p_mat.shape[0], q_mat.shape[0], p_mat.shape[1]
    else:
        mm, nn, kk = p_mat.shape[1], q_mat.shape[1], p_mat.shape[0]
    max_dim = _pow2(max(mm, nn, kk, p_mat.shape[0], p_mat.shape[1], q_mat.shape[0], q_mat.shape[1],
                        max(array_rows, array_cols)))
    core_options = dict(core_options or {})
    unit = MacUnit(rows=array_rows, cols=array_cols, max_dim=max_dim, out_width=out_width,
                   **core_options)
    core, lanes = unit.core, unit.core.lanes
    out = np.full((mm, nn), np.iinfo(np.int64).min, dtype=np.int64)
    mask = np.zeros((mm, nn), dtype=bool)
    res: dict = {}

    async def bench(ctx):
        res["load_beats"] = (await load_skewed(ctx, unit.p, p_mat, lanes)
                             + await load_skewed(ctx, unit.q, q_mat, lanes))
        if bias is not None:
            await load_bias(ctx, core, bias)
        for sig, v in ((core.mode, HwMode(int(mode))), (core.m, mm), (core.n, nn), (core.k, kk),
                       (core.shift, shift), (core.relu, int(relu)),
                       (core.use_bias, int(bias is not None)), (core.bias_shift, bias_shift)):
            ctx.set(sig, v)
        if core_options.get("settled_config"):
            await ctx.tick()        # the core's promise: configuration held a cycle before start
        ctx.set(core.start, 1)
        await ctx.tick()
        ctx.set(core.start, 0)
        cycle = 0
        while True:
            ready = 1 if ready_pattern is None else ready_pattern[cycle % len(ready_pattern)]
            ctx.set(core.out.ready, ready)
            if ctx.get(core.out.valid) and ready:
                pl = ctx.get(core.out.payload)
                for c in range(pl.count):
                    out[pl.row, pl.col + c] = pl.data[c]
                    mask[pl.row, pl.col + c] = (pl.relu_mask >> c) & 1
            done = ctx.get(core.done)
            await ctx.tick()
            cycle += 1
            if done:
                break
            if cycle > max_cycles:
                raise RuntimeError(f"MacArray did not finish in {max_cycles} cycles")
        res["cycles"] = cycle
        for name in ("busy_cycles", "active_cycles", "mac_ops", "stall_cycles", "saturations"):
            res[name] = ctx.get(getattr(core, name))

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    t0 = time.time()
    sim.run()
    res.update(out=out, relu_mask=mask, cells=array_rows * array_cols, sim_wall_s=time.time() - t0)
    return res


def verify_mac(rows: int, cols: int, depth: int, mode="fwd", *, array_rows: int = 4,
               array_cols: int = 4, shift: int | None = None, relu: bool = False,
               bias: bool = False, backpressure: float = 0.0, seed: int = 0,
               value_bits: int = 16, front_end: str = "unit", max_dim: int = 64,
               max_depth: int | None = None, bus_width: int = 128, latency: int = 8) -> dict:
    """One random ``rows x cols`` output over ``depth`` in ``mode`` (fwd, dx, dw) on an
    ``array_rows x array_cols`` MacArray, compared bit for bit with golden.

    ``front_end``: ``"axi"`` runs the AXI top on Verilator (``max_dim``, ``max_depth``
    (default ``max(64, depth)`` rounded to a power of two), ``bus_width`` pick the build;
    ``backpressure`` pauses every AXI channel with that probability, ``latency`` delays
    reads); ``"unit"`` runs the compute unit in the Amaranth simulator (``backpressure``:
    probability that the output sink is not ready in a cycle).

    Returns ``match``, ``cycles`` (busy cycles), ``mac_utilization``
    (useful MACs / (busy cycles x cells)), the counters and the golden saturations.
    """
    mode = MacMode.parse(mode)
    for name, v in (("rows", rows), ("cols", cols), ("depth", depth)):
        if not 1 <= v <= 4096:
            raise InputError(f"--{name} must be in 1..4096, got {v}")
    if not 0.0 <= backpressure < 1.0:
        raise InputError(f"backpressure must be in [0, 1), got {backpressure}")
    if front_end not in ("axi", "unit"):
        raise InputError(f"front_end must be 'axi' or 'unit', got {front_end!r}")
    rng = np.random.default_rng(seed)
    (pr, pc), (qr, qc) = operand_shapes(mode, rows, cols, depth)
    lo, hi = -(1 << (value_bits - 1)), 1 << (value_bits - 1)
    p_mat = rng.integers(lo, hi, size=(pr, pc))
    q_mat = rng.integers(lo, hi, size=(qr, qc))
    if shift is None:  # keep most results in range: about half the product bits plus the sum growth
        shift = min(2 * value_bits - 1 - 15 + (depth - 1).bit_length() // 2 + 1, 62)
    bias_q = rng.integers(-(1 << 20), 1 << 20, size=cols) if (bias and mode is MacMode.FWD) else None
    relu = relu and mode is MacMode.FWD
    if front_end == "axi":
        return _verify_mac_axi(mode, p_mat, q_mat, bias_q, rows=rows, cols=cols, depth=depth,
                               shift=shift, relu=relu, array_rows=array_rows,
                               array_cols=array_cols, max_dim=max_dim, max_depth=max_depth,
                               bus_width=bus_width, latency=latency, backpressure=backpressure,
                               seed=seed)
    ready = None
    if backpressure:
        ready = [int(x) for x in rng.random(97) >= backpressure]
        ready[0] = 1
    want = mac(mode, p_mat, q_mat, shift=shift, relu=relu, bias_q=bias_q)
    got = run_mac_rtl(mode, p_mat, q_mat, shift=shift, relu=relu,
                      bias=bias_q, array_rows=array_rows, array_cols=array_cols, ready_pattern=ready)
    match = bool(np.array_equal(got["out"], want.out)) and got["saturations"] == want.saturations
    if want.relu_mask is not None:
        match = match and bool(np.array_equal(got["relu_mask"], want.relu_mask))
    busy = got["busy_cycles"]
    return {
        "unit": "mac", "front_end": "unit", "match": match, "mode": mode.name.lower(), "rows": rows,
        "cols": cols, "depth": depth, "array": [array_rows, array_cols], "shift": shift,
        "cycles": got["cycles"], "busy_cycles": busy, "active_cycles": got["active_cycles"],
        "mac_ops": got["mac_ops"], "stall_cycles": got["stall_cycles"],
        "mac_utilization": got["mac_ops"] / (busy * got["cells"]) if busy else 0.0,
        "saturations": got["saturations"], "golden_saturations": want.saturations,
        "load_beats": got["load_beats"], "sim_wall_s": round(got["sim_wall_s"], 2),
    }


def _verify_mac_axi(mode, p_mat, q_mat, bias_q, *, rows, cols, depth, shift, relu, array_rows,
                    array_cols, max_dim, max_depth, bus_width, latency, backpressure, seed) -> dict:
    import tempfile
    from dataclasses import asdict

    from gnnweave.hw.mac_array import MacArrayConfig
    from gnnweave.sim import runner
    from gnnweave.sim.mac_array_bench import BENCH_MODULE, MacJob, build_mac_array, job_to_npz

    if max_depth is None:
        max_depth = 64          # the `small` build's: a deeper k is split into depth blocks
    config = MacArrayConfig(rows=array_rows, cols=array_cols, max_dim=max_dim,
                            max_depth=max_depth, bus_width=bus_width)
    job = MacJob(mode=int(mode), p=p_mat, q=q_mat, shift=shift, bias=bias_q, relu=relu,
                 bus_bytes=bus_width // 8)
    t0 = time.time()
    built = build_mac_array(config)
    build_s = time.time() - t0
    with tempfile.TemporaryDirectory(prefix="gnnweave-mac-") as tmp:
        path = f"{tmp}/job.npz"
        job_to_npz(job, path)
        res = runner.run(built, BENCH_MODULE, testcase="job_from_file", check=False,
                         params={"config": asdict(config), "job_file": path, "latency": latency,
                                 "backpressure": backpressure or None, "seed": seed},
                         run_name="verify_mac")
    rep = res.results.get("job")
    report = {"unit": "mac", "front_end": "axi", "mode": mode.name.lower(), "rows": rows,
              "cols": cols, "depth": depth, "array": [array_rows, array_cols],
              "max_dim": max_dim, "max_depth": max_depth, "bus_width": bus_width, "shift": shift}
    if rep is None:
        return report | {"match": False, "error": f"simulation produced no result; log {res.log}"}
    cnt = rep["counters"]
    busy = cnt["busy_cycles"]
    report.update({
        "match": res.failed == 0 and rep["mismatches"] == 0 and cnt["saturations"] == rep["golden_saturations"],
        "mismatches": rep["mismatches"], "cycles": busy, "busy_cycles": busy,
        "mac_active_cycles": cnt["mac_active_cycles"], "mac_ops": cnt["mac_ops"],
        "stall_cycles": cnt["stall_cycles"], "load_cycles": cnt["load_cycles"],
        "mac_utilization": cnt["mac_ops"] / (busy * config.cells) if busy else 0.0,
        "read_beats": cnt["read_beats"], "write_beats": cnt["write_beats"],
        "saturations": cnt["saturations"], "golden_saturations": rep["golden_saturations"],
        "status": rep["status"], "violations": rep["violations"], "stray_writes": rep["stray_writes"],
        "sim_seconds": round(rep["sim_seconds"], 2), "build_seconds": round(build_s, 2),
    })
    if res.failed:
        report["error"] = "; ".join(res.failures)[:2000]
    return report
