"""Executors: cpu against scipy/golden float references, fpga-emu against the golden
models (bit-exact, shard-concatenation identical), unavailable devices fail cleanly."""
import numpy as np
import pytest

from gnnweave.golden.aggregate import aggregate_float
from gnnweave.graph import CSRGraph
from gnnweave.host.executors import (
    CpuExecutor, DeviceUnavailable, Executor, FpgaEmuExecutor, OpResult, available_devices,
    make_executor,
)


def random_graph(n=60, e=400, seed=0, weighted=True):
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, e))
    w = rng.uniform(0.05, 1.0, size=e) if weighted else None
    return CSRGraph.from_edge_index(ei, n, w)


@pytest.fixture
def graph():
    return random_graph()


@pytest.fixture
def x():
    return np.random.default_rng(1).normal(size=(60, 12)).astype(np.float32)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_cpu_aggregate_matches_float_reference(graph, x, reduce):
    res = CpuExecutor().aggregate(graph, x, reduce)
    assert isinstance(res, OpResult) and res.op == "aggregate" and res.executor == "cpu"
    ref = aggregate_float(graph, x, reduce, weights=graph.weights)
    np.testing.assert_allclose(res.value, ref, rtol=1e-5, atol=1e-5)


def test_cpu_aggregate_sum_is_scipy_product(graph, x):
    ref = graph.to_scipy() @ x.astype(np.float64)
    np.testing.assert_allclose(CpuExecutor().aggregate(graph, x).value, ref, rtol=1e-5, atol=1e-5)
    ref_t = graph.to_scipy().T @ x.astype(np.float64)
    np.testing.assert_allclose(CpuExecutor().aggregate(graph, x, transpose=True).value, ref_t,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cpu", "fpga-emu"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_row_shards_concatenate_to_the_whole(graph, x, name, reduce):
    ex = make_executor(name)
    whole = ex.aggregate(graph, x, reduce, transpose=True).value
    cuts = [0, 7, 7, 31, 60]
    parts = [ex.aggregate(graph, x, reduce, rows=(lo, hi), transpose=True).value
             for lo, hi in zip(cuts[:-1], cuts[1:])]
    assert [p.shape[0] for p in parts] == [7, 0, 24, 29]
    joined = np.concatenate(parts)
    if name == "fpga-emu":
        np.testing.assert_array_equal(joined, whole)   # bit-identical
    else:
        np.testing.assert_allclose(joined, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_fpga_emu_aggregate_close_to_float_and_never_saturates(graph, x, reduce):
    res = FpgaEmuExecutor().aggregate(graph, x, reduce)
    ref = aggregate_float(graph, x, reduce, weights=graph.weights)
    assert res.saturations == 0
    scale = np.abs(ref).max()
    assert np.abs(res.value - ref).max() < scale * 2 ** -9
    assert res.device_seconds > 0


def test_fpga_emu_aggregate_is_the_golden_model(graph, x):
    """The emulator's integers are exactly the golden Aggregator's on the same formats."""
    from gnnweave.fixed import FixedFormat, choose_frac
    from gnnweave.golden.aggregate import AggregateFormat, aggregate
    res = FpgaEmuExecutor().aggregate(graph, x, "sum")
    ff = FixedFormat(16, choose_frac(x, 16))
    wf = FixedFormat(16, choose_frac(graph.weights, 16))
    row_sums = np.add.reduceat(np.abs(graph.weights), graph.indptr[:-1][graph.in_degree > 0])
    of = FixedFormat(16, min(choose_frac(np.array([row_sums.max() * np.abs(x).max()]), 16),
                             ff.frac + wf.frac))
    gold = aggregate(graph, ff.quantize(x)[0], "sum", AggregateFormat(ff, wf, of),
                     wf.quantize(graph.weights)[0])
    np.testing.assert_array_equal(res.value, of.to_float(gold.out).astype(np.float32))


def test_fpga_emu_times_the_run_the_accelerator_gets(graph):
    # the shard's rows, then the other rows empty (a shard keeps all N rows on the engine),
    # through the build's cycle model at the build's clock
    x = np.ones((60, 20), dtype=np.float32)
    ex = FpgaEmuExecutor()
    cm = ex.cycle_model
    assert cm.config == "small" and cm.clock_hz > 0 and cm.clock_source
    res = ex.aggregate(graph, x, rows=(0, 30))
    deg = np.diff(graph.indptr)
    job = np.concatenate([deg[:30], np.zeros(30, dtype=deg.dtype)])
    cycles = cm.aggregate_cycles(job, 20, weighted=True)
    assert res.device_seconds == pytest.approx(cycles / cm.clock_hz)
    # more than the read beats of the gathered rows alone (the old one-beat-a-cycle model)
    assert cycles > int(deg[:30].sum()) * 3
    # selectable build and clock
    other = FpgaEmuExecutor(config="default")
    assert other.cycle_model.config == "default"
    slow = FpgaEmuExecutor(cycle_model=type(cm)(clock_hz=cm.clock_hz / 2))
    assert slow.aggregate(graph, x, rows=(0, 30)).device_seconds == pytest.approx(
        2 * res.device_seconds)
    with pytest.raises(ValueError, match="cycle_model or config"):
        FpgaEmuExecutor(cycle_model=cm, config="small")


def test_cpu_dense_ops_match_numpy():
    rng = np.random.default_rng(2)
    x, w, b = rng.normal(size=(9, 5)), rng.normal(size=(5, 4)), rng.normal(size=4)
    dy = rng.normal(size=(9, 4))
    mask = rng.random((9, 4)) > 0.5
    ex = CpuExecutor()
    np.testing.assert_allclose(ex.dense_forward(x, w, b, relu=True).value,
                               np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ex.dense_input_grad(dy, w, relu_mask=mask).value,
                               (dy * mask) @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ex.dense_weight_grad(x, dy, relu_mask=mask).value,
                               x.T @ (dy * mask), rtol=1e-5, atol=1e-5)


def test_bad_inputs_name_the_field(graph, x):
    ex = CpuExecutor()
    with pytest.raises(ValueError, match="rows=.*not a node range"):
        ex.aggregate(graph, x, rows=(10, 99))
    with pytest.raises(ValueError, match="x: shape"):
        ex.aggregate(graph, x[:5])
    with pytest.raises(ValueError, match="unknown reduce"):
        ex.aggregate(graph, x, "median")
    with pytest.raises(ValueError, match="does not match"):
        ex.dense_forward(x, np.zeros((3, 2)))


def test_registry():
    devs = available_devices()
    assert devs[0] == "cpu" and "fpga-emu" in devs
    assert isinstance(make_executor("cpu"), Executor)
    assert make_executor("fpga-emu:1").name == "fpga-emu:1"
    with pytest.raises(DeviceUnavailable, match="unknown device 'tpu'.*available: cpu"):
        make_executor("tpu")
    assert issubclass(DeviceUnavailable, ValueError)


def test_fpga_without_a_board_lists_the_devices_there(monkeypatch):
    monkeypatch.delenv("GNNWEAVE_BITSTREAM", raising=False)
    with pytest.raises(DeviceUnavailable, match="no fpga device.*; available: cpu, .*fpga-emu"):
        make_executor("fpga")


def test_gpu_absent_is_device_unavailable():
    if any(d.startswith("gpu:") for d in available_devices()):
        pytest.skip("a CUDA device is present")
    with pytest.raises(DeviceUnavailable, match="no CUDA device.*available: cpu"):
        make_executor("gpu")


def test_transfers_report_bytes():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    res = FpgaEmuExecutor().transfer_in(a)
    assert res.bytes_in == a.nbytes and res.op == "transfer_in"
    np.testing.assert_array_equal(res.value, a)
    assert CpuExecutor().transfer_in(a).bytes_in == 0


def test_fpga_emu_dense_ops_are_the_golden_mac_and_close_to_float():
    from gnnweave.fixed import FixedFormat, choose_frac
    from gnnweave.golden import mac
    rng = np.random.default_rng(3)
    x, w, b = rng.normal(size=(40, 30)), rng.normal(size=(30, 8)) * 0.1, rng.normal(size=8)
    dy = rng.normal(size=(40, 8)) * 1e-3
    mask = rng.random((40, 8)) > 0.3
    ex = FpgaEmuExecutor()
    fwd = ex.dense_forward(x, w, b, relu=True)
    ref = np.maximum(x @ w + b, 0)
    assert fwd.saturations == 0
    assert np.abs(fwd.value - ref).max() < np.abs(ref).max() * 2 ** -10
    # the same integers as the golden model on the formats the emulator picks
    xf = FixedFormat(16, choose_frac(x, 16))
    wf = FixedFormat(16, choose_frac(w, 16))
    bf = FixedFormat(16, choose_frac(b, 16))
    pf = xf.frac + wf.frac
    out_frac = choose_frac(x @ w + b, 16)   # 'peak' range of the pre-activation
    gold = mac.mac_forward(xf.quantize(x)[0], wf.quantize(w)[0], bf.quantize(b)[0],
                           shift=pf - out_frac, relu=True, bias_shift=pf - bf.frac)
    np.testing.assert_array_equal(fwd.value, np.ldexp(gold.out.astype(np.float64), -out_frac)
                                  .astype(np.float32))
    dx = ex.dense_input_grad(dy, w, relu_mask=mask)
    ref_dx = (dy * mask) @ w.T
    assert np.abs(dx.value - ref_dx).max() < np.abs(ref_dx).max() * 2 ** -9
    dw = ex.dense_weight_grad(x, dy, relu_mask=mask)
    ref_dw = x.T @ (dy * mask)
    assert np.abs(dw.value - ref_dw).max() < np.abs(ref_dw).max() * 2 ** -9
    assert min(fwd.device_seconds, dx.device_seconds, dw.device_seconds) > 0


def test_fpga_emu_bound_range_never_saturates():
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(50, 20)), rng.normal(size=(20, 6))
    res = FpgaEmuExecutor(dense_range="bound").dense_forward(x, w)
    assert res.saturations == 0
    np.testing.assert_allclose(res.value, x @ w, atol=np.abs(x @ w).max() * 2 ** -7)


def test_fast_mac_route_equals_golden_mac():
    """The default 'fast' route (exact float64 BLAS accumulators) gives the golden integers,
    also at full-scale operands, with bias, ReLU and masks."""
    rng = np.random.default_rng(5)
    for trial in range(4):
        m, k, n = rng.integers(1, 70, size=3)
        x = rng.normal(size=(m, k)) * 10.0 ** rng.integers(-3, 3)
        w = rng.normal(size=(k, n))
        if trial == 3:   # extreme values: every operand at the format's edge
            x = np.sign(x) * np.abs(x).max()
            w = np.sign(w) * np.abs(w).max()
        b = rng.normal(size=n)
        dy = rng.normal(size=(m, n)) * 1e-2
        mask = rng.random((m, n)) > 0.4
        for rng_mode in ("peak", "bound"):
            fast = FpgaEmuExecutor(dense_range=rng_mode)
            gold = FpgaEmuExecutor(dense_range=rng_mode, mac_route="golden")
            for call in (lambda e: e.dense_forward(x, w, b, relu=True),
                         lambda e: e.dense_forward(x, w),
                         lambda e: e.dense_input_grad(dy, w, relu_mask=mask),
                         lambda e: e.dense_weight_grad(x, dy, relu_mask=mask)):
                a, g = call(fast), call(gold)
                np.testing.assert_array_equal(a.value, g.value)
                assert a.saturations == g.saturations


def test_quantize16_equals_the_format_spec():
    from gnnweave.fixed import FixedFormat, choose_frac
    from gnnweave.host.executors import quantize16
    rng = np.random.default_rng(6)
    for x in (rng.normal(size=(30, 7)).astype(np.float32), rng.normal(size=50) * 1e-5,
              np.array([0.5, -0.5, 1.5, 2.5, -2.5, 3.0]), np.zeros((3, 3))):
        q, fmt = quantize16(x)
        ref_fmt = FixedFormat(16, choose_frac(x, 16))
        assert fmt == ref_fmt
        np.testing.assert_array_equal(q, ref_fmt.quantize(x)[0])


def test_sparse_operand_route_equals_golden_mac():
    """Mostly-zero inputs take the CSR route of the exact accumulator; still golden."""
    rng = np.random.default_rng(7)
    x = rng.random((300, 400)) * (rng.random((300, 400)) < 0.02)
    w = rng.normal(size=(400, 9))
    dy = rng.normal(size=(300, 9))
    fast, gold = FpgaEmuExecutor(), FpgaEmuExecutor(mac_route="golden")
    for call in (lambda e: e.dense_forward(x, w, np.ones(9), relu=True),
                 lambda e: e.dense_weight_grad(x, dy)):
        np.testing.assert_array_equal(call(fast).value, call(gold).value)


class GoldenAccel:
    """An accelerator driver answering from the golden models: what FpgaExecutor sees of a
    board, without one (narrow ``max_feat_dim``, so wide features go in column chunks)."""

    max_feat_dim = 4
    has_mac = True

    def __init__(self):
        self.calls = []

    def check_graph(self, graph, weights=None):
        from types import SimpleNamespace
        return SimpleNamespace(indptr=graph.indptr, indices=graph.indices, weights=weights)

    def aggregate(self, shard, x_q, reduce, shift, weights=None, *, timeout_s):
        from gnnweave.golden.aggregate import aggregate_raw
        self.calls.append(("aggregate", x_q.shape))
        res = aggregate_raw(shard.indptr, shard.indices, x_q, reduce=reduce, shift=shift,
                            out_width=16, weights=shard.weights if weights is None else weights)
        return res.out, dict(saturations=res.saturations, edges=res.edges, busy_cycles=100)

    def mac(self, mode, p, q, *, shift, relu, bias, bias_shift, timeout_s):
        from gnnweave.golden.mac import mac
        self.calls.append(("mac", mode))
        res = mac(mode, p, q, shift=shift, relu=relu, bias_q=bias, bias_shift=bias_shift)
        return res.out, dict(saturations=res.saturations, busy_cycles=50)


def test_fpga_executor_is_bit_identical_to_fpga_emu_through_a_driver():
    from gnnweave.host.executors import FpgaExecutor, fpga
    assert fpga.FpgaExecutor is FpgaExecutor          # one class, defined once
    rng = np.random.default_rng(11)
    g = CSRGraph.from_edge_index(rng.integers(0, 40, (2, 300)), 40)
    g.weights = rng.uniform(0.1, 1.0, g.num_edges)
    x = rng.normal(size=(40, 10)).astype(np.float32)
    w = rng.normal(size=(10, 6)).astype(np.float32)
    accel = GoldenAccel()
    dev, emu = FpgaExecutor(accel, "fpga-sim", config="small"), FpgaEmuExecutor(config="small")
    for transpose in (False, True):
        a = dev.aggregate(g, x, "sum", rows=(5, 30), transpose=transpose)
        b = emu.aggregate(g, x, "sum", rows=(5, 30), transpose=transpose)
        np.testing.assert_array_equal(a.value, b.value)
        assert a.device_seconds == 3 * 100 / dev.cycle_model.clock_hz   # 10 columns in 3 runs
    a, b = dev.dense_forward(x, w, np.ones(6), relu=True), emu.dense_forward(x, w, np.ones(6), relu=True)
    np.testing.assert_array_equal(a.value, b.value)
    dy = rng.normal(size=(40, 6)).astype(np.float32)
    mask = rng.random((40, 6)) < 0.5
    for a, b in ((dev.dense_input_grad(dy, w, relu_mask=mask), emu.dense_input_grad(dy, w, relu_mask=mask)),
                 (dev.dense_weight_grad(x, dy, relu_mask=mask), emu.dense_weight_grad(x, dy, relu_mask=mask))):
        np.testing.assert_array_equal(a.value, b.value)
        assert a.device_seconds == 50 / dev.cycle_model.clock_hz     # measured, not modelled
    assert [c[0] for c in accel.calls].count("mac") == 3 and dev.emulated_dense_ops == 0


def test_executors_and_the_driver_do_not_import_each_other():
    import ast
    from pathlib import Path
    import gnnweave.host as host

    def imports(path):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                yield node.module + "." + ".".join(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                yield from (a.name for a in node.names)
    root = Path(host.__file__).parent
    driver = root / "driver"
    files = sorted(driver.rglob("*.py")) if driver.is_dir() else [root / "driver.py"]
    assert not [m for p in files for m in imports(p) if "host.executors" in m]


def test_public_names_of_what_distributed_training_reads():
    from gnnweave.host import executors
    rng = np.random.default_rng(3)
    g = CSRGraph.from_edge_index(rng.integers(0, 20, (2, 80)), 20)
    g.weights = rng.normal(size=g.num_edges)
    sums = np.zeros(20)
    np.add.at(sums, np.repeat(np.arange(20), np.diff(g.indptr)), np.abs(g.weights))
    assert executors.abs_row_weight_max(g) == pytest.approx(sums.max())
    a, b = rng.integers(-99, 99, (5, 7)), rng.integers(-99, 99, (7, 3))
    np.testing.assert_array_equal(FpgaEmuExecutor.accumulator("fwd", a, b), a @ b)
