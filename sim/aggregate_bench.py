"""cocotb tests of the Aggregator RTL against the golden model (run them with
:mod:`gnnweave.sim.runner`; ``tests/sim/test_aggregator_cocotb.py`` does).

Every job is checked by :func:`gnnweave.sim.tb.check_job`: every output word bit-exact
against :func:`gnnweave.golden.aggregate.aggregate_raw` on the same memory words, the
``edges``/``rejected_indices``/``saturations`` counters and the status bits against the
golden result, the beat counters against the bursts the bench saw, no burst outside the
declared buffers or across 4 KiB, and no byte written outside the real output bytes
(row padding, guards and every other buffer keep their fill pattern).

Parameters (JSON from the runner, all optional): ``config`` (name in ``hw.configs``,
default ``"default"``), ``latency`` (read latency in cycles), ``seed``, ``backpressure``
(pause probability for the random-graph tests), ``dataset`` (spec for ``cora_graph``),
``job_file`` (``.npz`` for ``job_from_file``, written by :mod:`gnnweave.sim.verify`).
"""
from __future__ import annotations

import numpy as np

try:
    import cocotb
except ImportError:  # pragma: no cover - only the job builders are used without cocotb
    cocotb = None

from gnnweave.layout import AggregateJob

SUM, MEAN, MAX = 0, 1, 2
REDUCES = {"sum": SUM, "mean": MEAN, "max": MAX}


# ------------------------------------------------------------------ job builders (numpy only)
def csr_from_lists(rows) -> tuple[np.ndarray, np.ndarray]:
    """``rows[v]`` = source ids of node v -> (indptr, indices)."""
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    indices = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if rows else np.zeros(0)
    return indptr, indices.astype(np.int64)


def random_features(rng, n, f, *, big=False):
    lim = 32767 if big else 600
    return rng.integers(-lim, lim + 1, size=(n, f), dtype=np.int64)


def random_weights(rng, e):
    return rng.integers(-32768, 32768, size=e, dtype=np.int64)


def default_shift(weighted: bool) -> int:
    """feat Q8.8 in, Q8.8 out; weights Q2.14 (the golden AggregateFormat defaults)."""
    return 14 if weighted else 0


#: Layout defaults for the configuration under test (bus width, an address the port can
#: reach); :func:`layout_for` fills it in the simulator before any job is made.
LAYOUT: dict = {}


def layout_for(config) -> dict:
    """Job layout that fits an ``AggregatorConfig``: its bus alignment, and the image
    above 4 GiB only where the address port is wider than 32 bits."""
    return {"bus_bytes": config.bus_width // 8,
            "base_addr": 0x1_2340_0000 if config.addr_width > 32 else 0x1234_0000}


def job(indptr, indices, x, reduce=SUM, weighted=False, rng=None, shift=None, **layout) -> AggregateJob:
    rng = rng if rng is not None else np.random.default_rng(0)
    weights = random_weights(rng, len(indices)) if weighted else None
    return AggregateJob(indptr=indptr, indices=indices, x=x, reduce=reduce, weights=weights,
                        shift=default_shift(weighted) if shift is None else shift,
                        **{**LAYOUT, **layout})


def random_graph_job(rng, n, avg_degree, f, reduce, weighted, **layout) -> AggregateJob:
    deg = rng.poisson(avg_degree, size=n)
    rows = [rng.integers(0, n, size=d) for d in deg]
    indptr, indices = csr_from_lists(rows)
    return job(indptr, indices, random_features(rng, n, f), reduce, weighted, rng, **layout)


def edge_case_jobs(name: str, rng) -> list[AggregateJob]:
    """Small hand-made graphs; each in every reduce op, unweighted and weighted."""
    def every_op(make):
        return [make(r, w) for r in (SUM, MEAN, MAX) for w in (False, True)]

    if name == "empty":            # N > 0, no edges: every output 0
        return every_op(lambda r, w: job([0] * 6, [], random_features(rng, 5, 8), r, w, rng))
    if name == "one_node":      # N = 1 with a self loop
        return every_op(lambda r, w: job([0, 1], [0], random_features(rng, 1, 5), r, w, rng))
    if name == "isolated":         # nodes without edges in between nodes with edges
        rows = [[1, 2], [], [], [0], [], [4, 4, 1], []]
        ip, ix = csr_from_lists(rows)
        return every_op(lambda r, w: job(ip, ix, random_features(rng, 7, 12), r, w, rng))
    if name == "self_loops":
        rows = [[0], [1, 0], [2, 2, 2], [3, 1]]
        ip, ix = csr_from_lists(rows)
        return every_op(lambda r, w: job(ip, ix, random_features(rng, 4, 9), r, w, rng))
    if name == "duplicates":       # the same edge many times counts every time
        rows = [[2] * 7, [0, 0, 1, 1], [1] * 3 + [0] * 2, [3] * 20]
        ip, ix = csr_from_lists(rows)
        return every_op(lambda r, w: job(ip, ix, random_features(rng, 4, 16), r, w, rng))
    if name == "hub":              # one node holds most of the edges
        n = 40
        rows = [list(rng.integers(0, n, size=int(rng.integers(0, 3)))) for _ in range(n)]
        rows[5] = list(rng.integers(0, n, size=600))
        ip, ix = csr_from_lists(rows)
        return every_op(lambda r, w: job(ip, ix, random_features(rng, n, 8), r, w, rng))
    if name == "feat_dims":        # rows that do not fill whole beats, and strides with slack
        jobs = []
        for f in (1, 7, 8, 9, 17, 33):
            n = 12
            rows = [list(rng.integers(0, n, size=int(rng.integers(0, 5)))) for _ in range(n)]
            ip, ix = csr_from_lists(rows)
            for r in (SUM, MEAN, MAX):
                jobs.append(job(ip, ix, random_features(rng, n, f), r, f % 2 == 1, rng))
            bus = LAYOUT.get("bus_bytes", 16)
            pad = -(-2 * f // bus) * bus + 2 * bus
            jobs.append(job(ip, ix, random_features(rng, n, f), SUM, False, rng,
                            feat_stride=pad, out_stride=pad + 16))
        return jobs
    if name == "saturate":         # sums beyond int16 (and mean's 32-bit intermediate)
        n = 6
        rows = [[0, 1, 2, 3] * 3, [4, 5], [0], [1, 2], [], [3, 3, 3]]
        ip, ix = csr_from_lists(rows)
        x = random_features(rng, n, 10, big=True)
        x[0], x[1] = 32767, -32768
        jobs = [job(ip, ix, x, r, w, rng, shift=s) for r in (SUM, MEAN, MAX) for w in (False, True)
                for s in (0, 4)]
        jobs.append(job(ip, ix, x, MEAN, True, rng, shift=0))  # |sum| > 2**31 in mean's S
        return jobs
    if name == "bad_index":     # indices >= N are skipped, counted, never read
        n = 9
        rows = [[0, 9, 3], [0xFFFF_FFFF, 1], [10, 11, 12], [], [2, 8, 1 << 31], [4]]
        rows += [[n]] * 3
        ip, ix = csr_from_lists(rows)
        return every_op(lambda r, w: job(ip, ix, random_features(rng, n, 7), r, w, rng))
    if name == "bad_indptr":       # clamped as the spec says, never outside indices
        n, e = 6, 10
        ix = rng.integers(0, n, size=e)
        cases = [[2, 4, 6, 8, 10, 10, 10],       # does not start at 0
                 [0, 5, 3, 7, 9, 10, 10],        # decreases
                 [0, 2, 4, 30, 31, 40, 50],      # runs past E
                 [0, 1, 2, 3, 4, 5, 6],          # ends before E
                 [0, 0xFFFF_FFFF, 3, 4, 5, 8, 10]]
        return [job(ip, ix, random_features(rng, n, 9), r, w, rng)
                for ip in cases for r in (SUM, MEAN) for w in (False, True)] + \
               [job(cases[1], ix, random_features(rng, n, 9), MAX, False, rng)]
    raise ValueError(f"unknown edge case {name!r}")


#: names are identifiers of at most 10 characters: cocotb then uses them in test names
#: (``edge_cases/case=hub``) instead of indices
EDGE_CASES = ("empty", "one_node", "isolated", "self_loops", "duplicates", "hub", "feat_dims",
              "saturate", "bad_index", "bad_indptr")


def config_error_jobs(rng, max_feat_dim: int) -> list[tuple[str, AggregateJob]]:
    """Jobs the engine must refuse (status.config_error, no memory traffic)."""
    rows = [[1, 2], [0], [2, 2, 1]]
    ip, ix = csr_from_lists(rows)
    x = random_features(rng, 3, 16)
    mk = lambda **kw: job(ip, ix, x, SUM, kw.pop("weighted", False), rng, **kw)  # noqa: E731
    f_big = max_feat_dim + 1
    stride_big = -(-2 * f_big // 16) * 16
    cases = [
        ("feat_dim_zero", mk(registers_override={"feat_dim": 0})),
        ("feat_dim_too_big", mk(registers_override={"feat_dim": f_big}, feat_stride=stride_big,
                                out_stride=stride_big,
                                sizes={"feat": 3 * stride_big, "out": 3 * stride_big})),
        ("reduce_op_3", mk(registers_override={"reduce_op": 3})),
        ("indptr_misaligned", mk(addr_offsets={"indptr": 4})),
        ("indices_misaligned", mk(addr_offsets={"indices": 4})),
        ("feat_misaligned", mk(addr_offsets={"feat": 2})),
        ("out_misaligned", mk(addr_offsets={"out": 6})),
        ("weights_misaligned", mk(addr_offsets={"weights": 4}, weighted=True)),
        ("feat_stride_unaligned", mk(feat_stride=36)),
        ("out_stride_too_small", mk(out_stride=16)),
        ("indptr_small", mk(sizes={"indptr": 4 * 4 - 4})),
        ("indices_small", mk(sizes={"indices": 4 * 5})),
        ("weights_small", mk(sizes={"weights": 2 * 5}, weighted=True)),
        ("feat_small", mk(sizes={"feat": 2 * 32 + 16})),
        ("out_small", mk(sizes={"out": 2 * 32})),
        # the streams are read in whole beats: a size that ends inside the last beat is refused
        ("indices_part_beat", mk(sizes={"indices": 4 * 6})),
        ("weights_part_beat", mk(sizes={"weights": 2 * 6}, weighted=True)),
    ]
    for name, j in cases:
        if not j.config_error_expected(max_feat_dim):
            raise AssertionError(f"config-error case {name} is not an error by the contract")
    return cases


def job_to_npz(j: AggregateJob, path) -> None:
    arrays = dict(indptr=j.indptr, indices=j.indices, x=j.x, reduce=j.reduce, shift=j.shift,
                  num_edges=j.num_edges)
    if j.weights is not None:
        arrays["weights"] = j.weights
    np.savez(path, **arrays)


def job_from_npz(path) -> AggregateJob:
    with np.load(path, allow_pickle=False) as z:
        return AggregateJob(indptr=z["indptr"], indices=z["indices"], x=z["x"], reduce=int(z["reduce"]),
                            shift=int(z["shift"]), num_edges=int(z["num_edges"]),
                            weights=z["weights"] if "weights" in z.files else None, **LAYOUT)


# ------------------------------------------------------------------ cocotb tests
if cocotb is not None:
    from gnnweave.sim.tb import AggregatorTB, check_job, load_params, store_result

    def _config(params):
        from gnnweave.hw.aggregator import aggregator_regmap
        from gnnweave.hw.configs import CONFIGS
        name = params.get("config", "default")
        cfg = CONFIGS[name]
        LAYOUT.clear()
        LAYOUT.update(layout_for(cfg))
        return cfg, aggregator_regmap(cfg)

    async def _bench(dut, latency=None, backpressure=None):
        params = load_params()
        cfg, regmap = _config(params)
        lat = params.get("latency", 8) if latency is None else latency
        tb = AggregatorTB(dut, regmap, latency=lat, max_outstanding=params.get("max_outstanding", 64))
        tb.max_feat_dim = cfg.max_feat_dim
        if backpressure:
            tb.set_backpressure(backpressure, seed=params.get("seed", 0))
        await tb.reset()
        return tb, params

    async def _run_checked(tb, j, label):
        result = await tb.run_job(j)
        try:
            summary = check_job(j, result, max_feat_dim=tb.max_feat_dim)
        except AssertionError as exc:
            raise AssertionError(f"{label} (N={j.num_nodes}, E={j.num_edges}, F={j.feat_dim}, "
                                 f"reduce={j.reduce}, weighted={j.use_weights}, shift={j.shift}): {exc}") from None
        return result, summary

    @cocotb.test()
    @cocotb.parametrize(case=list(EDGE_CASES))
    async def edge_cases(dut, case):
        tb, params = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0) + EDGE_CASES.index(case))
        totals = {"jobs": 0, "edges": 0, "rejected": 0, "saturations": 0}
        for i, j in enumerate(edge_case_jobs(case, rng)):
            result, _ = await _run_checked(tb, j, f"{case}[{i}]")
            totals["jobs"] += 1
            totals["edges"] += result.counters["edges"]
            totals["rejected"] += result.counters["rejected_indices"]
            totals["saturations"] += result.counters["saturations"]
        store_result(f"edge_cases/{case}", totals)

    @cocotb.test()
    async def config_errors(dut):
        tb, params = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0))
        refused = []
        for name, j in config_error_jobs(rng, tb.max_feat_dim):
            await _run_checked(tb, j, f"config error {name}")
            refused.append(name)
        # and the engine still works afterwards
        good = random_graph_job(rng, 20, 3, 16, SUM, False)
        await _run_checked(tb, good, "after config errors")
        store_result("config_errors", refused)

    @cocotb.test()
    @cocotb.parametrize(reduce=["sum", "mean", "max"], weighted=[False, True])
    async def random_graphs(dut, reduce, weighted):
        params = load_params()
        bp = params.get("backpressure", 0.25)
        tb, params = await _bench(dut, latency=params.get("latency", 32), backpressure=bp)
        rng = np.random.default_rng(params.get("seed", 0) * 7 + REDUCES[reduce] * 2 + int(weighted))
        stats = []
        for n, deg, f in ((50, 4.0, 16), (80, 2.5, 9), (30, 8.0, 24)):
            j = random_graph_job(rng, n, deg, f, REDUCES[reduce], weighted)
            result, _ = await _run_checked(tb, j, f"random {reduce} weighted={weighted}")
            stats.append(result.counters["busy_cycles"])
        store_result(f"random_graphs/{reduce}/{int(weighted)}", stats)

    @cocotb.test()
    async def no_backpressure_fast_path(dut):
        """Latency 0, no pauses: the tightest timing the engine sees."""
        tb, params = await _bench(dut, latency=0)
        rng = np.random.default_rng(params.get("seed", 0) + 99)
        for reduce in (SUM, MEAN, MAX):
            j = random_graph_job(rng, 60, 5.0, 8, reduce, reduce == MEAN)
            await _run_checked(tb, j, "latency 0")

    @cocotb.test()
    async def reset_mid_run(dut):
        """Reset while bursts are in flight; the next run is correct and the old one left no trace."""
        tb, params = await _bench(dut, latency=40)
        rng = np.random.default_rng(params.get("seed", 0) + 5)
        first = random_graph_job(rng, 200, 6.0, 16, SUM, True)
        bursts_before = await tb.reset_during(first, max_cycles=2000)
        ctrl = await tb.read_reg("ap_ctrl")
        assert ctrl & 4, f"not idle after reset (ap_ctrl=0x{ctrl:x})"
        second = random_graph_job(rng, 120, 5.0, 12, MEAN, False,
                                  base_addr=LAYOUT["base_addr"] + 0x1000_0000)
        result, _ = await _run_checked(tb, second, "after reset")
        assert all(b.addr >= second.base_addr for b in result.bursts), "stale burst after reset"
        store_result("reset_mid_run", {"bursts_before_reset": bursts_before,
                                       "cycles_after": result.counters["busy_cycles"]})

    @cocotb.test()
    async def dataset_graph(dut):
        """A real graph (Cora by default), F=16, random features; all three reductions."""
        from gnnweave.datasets import load_dataset
        params = load_params()
        spec = params.get("dataset", "cora")
        tb, params = await _bench(dut, latency=params.get("latency", 32))
        graph = load_dataset(spec).graph
        rng = np.random.default_rng(params.get("seed", 0))
        out = {}
        for reduce in params.get("reduces", ["sum", "mean", "max"]):
            weighted = reduce == "sum"
            x = random_features(rng, graph.num_nodes, 16)
            j = job(graph.indptr, graph.indices, x, REDUCES[reduce], weighted, rng)
            result, _ = await _run_checked(tb, j, f"{spec} {reduce}")
            out[reduce] = {"busy_cycles": result.counters["busy_cycles"],
                           "read_beats": result.counters["read_beats"], "edges": result.counters["edges"]}
        store_result("dataset_graph", out)

    @cocotb.test()
    async def job_from_file(dut):
        """One job from ``params['job_file']`` (verify / benchmarks); reports everything."""
        import time
        params = load_params()
        tb, params = await _bench(dut, latency=params.get("latency", 32),
                                  backpressure=params.get("backpressure"))
        j = job_from_npz(params["job_file"])
        t0 = time.perf_counter()
        result = await tb.run_job(j, timeout_cycles=params.get("timeout_cycles"))
        wall = time.perf_counter() - t0
        from gnnweave.sim.tb import golden_for
        gold = golden_for(j)
        mism = int(np.count_nonzero(result.out != gold.out))
        summary = result.summary()
        summary.update(mismatches=mism, golden={"edges": gold.edges, "rejected": gold.rejected,
                                                "saturations": gold.saturations,
                                                "bad_indptr": gold.bad_indptr},
                       wall_seconds=wall, sim_cycles=result.cycles)
        store_result("job", summary)
        check_job(j, result, max_feat_dim=tb.max_feat_dim)
