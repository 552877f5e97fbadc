"""The native simulated device (the Verilated accelerator top + C++ memory model):
bit-exact against the golden model, the same cycle counts as the cocotb bench, memory
safety, faults, reset, idle units unclocked without any change in behaviour.

The harness is built once per content under build/native (first build: a few minutes;
cached after that).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from gnnweave.contract import (
    CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, AggregatorStatus, CtrlBit, GieBit, IrqBit,
)
from gnnweave.golden.aggregate import Reduce, aggregate_raw
from gnnweave.layout import AggregateJob
from gnnweave.sim import device as simdevice
from gnnweave.sim.device import build as native_build
from gnnweave.sim.aggregate_bench import (
    EDGE_CASES, MAX, MEAN, SUM, config_error_jobs, edge_case_jobs, random_graph_job)
from tests.conftest import require_dataset

CONFIG = "small"
MAX_FEAT = 64


@pytest.fixture(scope="module")
def native():
    simdevice.build_native(CONFIG)
    sim = simdevice.NativeAccelerator(np.zeros(4096, np.uint8), 0x1000_0000, latency=16,
                                     config=CONFIG)
    yield sim
    sim.close()


def golden(job: AggregateJob):
    return aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce(int(job.reduce)),
                         shift=int(job.shift), out_width=16, weights=job.weights,
                         num_edges=int(job.num_edges))


def check(job: AggregateJob, res: simdevice.NativeJobResult, label: str = ""):
    """The contract: golden output words and counters, status bits, nothing written
    outside the output rows, no access outside the memory."""
    where = f"{label} (N={job.num_nodes}, E={job.num_edges}, F={job.feat_dim}, reduce={job.reduce}, " \
            f"weighted={job.use_weights})"
    assert not res.timed_out, f"{where}: no interrupt"
    assert res.faults == 0, f"{where}: {res.first_fault}"
    assert len(job.stray_writes(res.memory)) == 0, f"{where}: bytes written outside the output rows"
    flags = {name: bool(res.status >> bit & 1) for name, bit in
             (("config_error", 0), ("index_rejected", 1), ("bad_indptr", 2), ("addr_fault", 3),
              ("axi_error", 4))}
    assert not flags["addr_fault"] and not flags["axi_error"], f"{where}: status 0x{res.status:x}"
    if job.config_error_expected(MAX_FEAT):
        assert flags["config_error"], f"{where}: config error expected"
        assert res.counters["read_beats"] == 0 and res.counters["write_beats"] == 0
        return
    gold = golden(job)
    assert not flags["config_error"], f"{where}: unexpected config error"
    bad = np.argwhere(res.out != gold.out)
    assert bad.size == 0, f"{where}: {bad.shape[0]} words differ, first {tuple(bad[0])}"
    assert res.counters["edges"] == gold.edges
    assert res.counters["rejected_indices"] == gold.rejected
    assert res.counters["saturations"] == gold.saturations
    assert flags["bad_indptr"] == gold.bad_indptr
    assert flags["index_rejected"] == (gold.rejected > 0)


@pytest.mark.parametrize("reduce", [SUM, MEAN, MAX])
@pytest.mark.parametrize("weighted", [False, True])
def test_random_graphs_bit_exact(native, reduce, weighted):
    rng = np.random.default_rng(100 + 3 * reduce + weighted)
    for n, deg, f in ((50, 4.0, 16), (80, 2.5, 9), (30, 8.0, 24), (64, 3.0, 64)):
        job = random_graph_job(rng, n, deg, f, reduce, weighted)
        check(job, simdevice.run_job(job, latency=int(rng.integers(0, 40)), sim=native,
                                     config=CONFIG), "random")


@pytest.mark.parametrize("case", EDGE_CASES)
def test_edge_cases(native, case):
    rng = np.random.default_rng(EDGE_CASES.index(case))
    for i, job in enumerate(edge_case_jobs(case, rng)):
        check(job, simdevice.run_job(job, latency=8, sim=native, config=CONFIG), f"{case}[{i}]")


def test_config_errors_then_a_good_run(native):
    rng = np.random.default_rng(7)
    for name, job in config_error_jobs(rng, MAX_FEAT):
        before = native.stats()
        res = simdevice.run_job(job, latency=8, sim=native, config=CONFIG)
        check(job, res, name)
        after = native.stats()
        assert after["ar_bursts"] == before["ar_bursts"], f"{name}: memory read after a config error"
        assert after["aw_bursts"] == before["aw_bursts"], f"{name}: memory written after a config error"
    good = random_graph_job(rng, 20, 3, 16, SUM, False)
    check(good, simdevice.run_job(good, latency=8, sim=native, config=CONFIG), "after")


def test_cora_bit_exact(native):
    graph = require_dataset("cora").graph
    from gnnweave.sim.verify import make_job
    for reduce, weighted in (("sum", True), ("mean", False), ("max", False)):
        job = make_job(graph, 16, reduce, weighted=weighted, seed=1)
        check(job, simdevice.run_job(job, latency=32, sim=native, config=CONFIG), f"cora {reduce}")


def test_memory_outside_the_buffer_is_recorded(native):
    """The job's output rows lie beyond the end of the simulated memory: every beat there
    is refused and recorded, nothing is written past the array."""
    rng = np.random.default_rng(3)
    job = random_graph_job(rng, 40, 3.0, 16, SUM, False)
    image = job.memory_image()
    out_off = job.regions["out"].addr - job.base_addr
    backing = np.full(image.size + 64, 0x5A, np.uint8)
    short = backing[:out_off + 32]          # the memory ends two beats into the output
    short[:] = image[:short.size]
    native.clear_faults()
    native.set_memory(short, job.base_addr)
    for name, value in job.registers().items():
        simdevice.write_register(native, simdevice.regmap(CONFIG)[name], value)
    native.reg_write(GIE_OFFSET, GieBit.ENABLE.mask)
    native.reg_write(IER_OFFSET, IrqBit.AP_DONE.mask)
    native.reg_write(CTRL_OFFSET, CtrlBit.AP_START.mask)
    native.run_until_interrupt(200_000)
    assert native.interrupt
    native.reg_write(ISR_OFFSET, IrqBit.AP_DONE.mask)
    faults = native.stats()["faults"]
    assert faults > 0 and "write" in native.first_fault() and "outside memory" in native.first_fault()
    assert np.all(backing[short.size:] == 0x5A), "the harness wrote past the memory array"
    status = simdevice.read_register(native, simdevice.regmap(CONFIG)["status"])
    assert status & AggregatorStatus.AXI_ERROR, "SLVERR on B must raise status.axi_error"
    native.clear_faults()


def test_hung_memory_then_reset_and_rerun(native):
    rng = np.random.default_rng(4)
    job = random_graph_job(rng, 60, 4.0, 16, MEAN, True)
    native.set_read_stall(True)
    res = simdevice.run_job(job, latency=8, sim=native, config=CONFIG, max_cycles=20_000)
    assert res.timed_out
    ctrl = native.reg_read(CTRL_OFFSET)
    assert not ctrl & CtrlBit.AP_IDLE.mask, "a hung run must leave the engine busy (not idle)"
    native.set_read_stall(False)
    native.reset()
    assert native.reg_read(CTRL_OFFSET) & CtrlBit.AP_IDLE.mask, "idle after reset"
    job2 = random_graph_job(rng, 50, 3.0, 12, SUM, False, base_addr=0x2_0000_0000)
    check(job2, simdevice.run_job(job2, latency=8, sim=native, config=CONFIG), "after reset")


def test_harness_latency_definition_matches_cocotb_bench():
    """Same job, same latency, no backpressure: busy_cycles of the native device equal the
    cocotb bench's (sim/tb.py DelayedReadAddress + cocotbext-axi AxiRam)."""
    from gnnweave.sim.verify import load_graph, make_job, verify_aggregate
    for latency, reduce, weighted in ((32, "sum", True), (0, "mean", False)):
        rep = verify_aggregate("rmat:6:4", 16, reduce, "verilator", latency=latency,
                               config=CONFIG, weighted=weighted)
        assert rep["match"], rep.get("error")
        job = make_job(load_graph("rmat:6:4"), 16, reduce, weighted=weighted)
        native = simdevice.run_job(job, latency=latency, config=CONFIG)
        check(job, native, "rmat:6:4")
        assert native.counters["busy_cycles"] == rep["cycles"], (latency, reduce)
        assert native.counters["read_beats"] == rep["read_beats"]
        assert native.counters["mem_wait_cycles"] == rep["counters"]["mem_wait_cycles"]


def test_one_eval_per_cycle_is_exact(native):
    """The harness evaluates the model once per cycle (no falling-edge eval). That is
    exact only while no output the bench samples depends combinationally on an input:
    the check mode runs the falling-edge eval anyway and counts cycles where it changed a
    sampled output. The same jobs in the two-eval mode give identical cycles, counters
    and outputs."""
    assert native.set_one_eval(True), "this Verilator's model hides the clock's edge detector"
    rng = np.random.default_rng(11)
    cases = [(random_graph_job(rng, 70, 4.0, 24, MEAN, True), 17),
             (random_graph_job(rng, 60, 3.0, 16, MAX, False), 0)]
    native.check_one_eval(True)
    try:
        one = [simdevice.run_job(job, latency=lat, sim=native, config=CONFIG)
               for job, lat in cases]
    finally:
        native.check_one_eval(False)
    assert native.one_eval_mismatches == 0
    assert not native.set_one_eval(False)
    try:
        two = [simdevice.run_job(job, latency=lat, sim=native, config=CONFIG)
               for job, lat in cases]
    finally:
        native.set_one_eval(True)
    for (job, _), a, b in zip(cases, one, two):
        check(job, a, "one eval")
        check(job, b, "two evals")
        assert a.cycles == b.cycles and a.counters == b.counters
        assert np.array_equal(a.out, b.out)


def test_build_cache_key_names_the_cpu(monkeypatch):
    """The default build compiles for this CPU (-march=native, compile and LTO link), so its
    cache key includes the CPU: a build directory reached from another kind of CPU is
    rebuilt, not loaded (where it could stop on an illegal instruction)."""
    monkeypatch.delenv("GNNWEAVE_NATIVE_OPT", raising=False)
    here = simdevice.build_plan(CONFIG)
    assert "-march=native" in here.cflags.split() and "-march=native" in here.ldflags.split()
    assert simdevice.build_plan(CONFIG).key == here.key
    monkeypatch.setattr(native_build, "cpu_identity", lambda: '["x86_64", "another CPU"]')
    assert simdevice.build_plan(CONFIG).key != here.key
    monkeypatch.undo()
    monkeypatch.setenv("GNNWEAVE_NATIVE_OPT", "-O3")     # a portable build: its own key
    assert simdevice.build_plan(CONFIG).key != here.key


def test_native_build_names_its_stages(tmp_path, monkeypatch, capsys):
    """A native build takes minutes: it names each stage on stderr while it runs (the
    compiles and the profile run replaced by stand-ins that leave their products)."""
    def stand_in(cmd, log, product, what):
        (log.parent / "obj").mkdir(exist_ok=True)
        if product is not None:
            product.write_bytes(b"")
    monkeypatch.setattr(native_build, "_logged_run", stand_in)
    monkeypatch.setenv("GNNWEAVE_PROGRESS", "1")
    monkeypatch.setenv("GNNWEAVE_NATIVE_PGO", "1")
    build = native_build.build_native(CONFIG, build_root=tmp_path)
    assert not build.cached
    err = capsys.readouterr().err
    for stage in ("(1/3): Verilator and C++ compile, instrumented for PGO", "(2/3): profile run",
                  "(3/3): Verilator and C++ compile from the profile"):
        assert f"native build of {CONFIG} {stage} (once per build" in err, err
        assert f"native build of {CONFIG} {stage}: done in" in err, err


def test_simulation_netlist_keeps_the_ports():
    """The Verilog the harness compiles (Amaranth's through SIM_NETLIST_PASSES) has the
    ports of Amaranth's, in width and direction, and no process left for Verilator to
    schedule as a block (the passes ran)."""
    netlist, top = simdevice.simulated_top(CONFIG)
    source = netlist.with_name(f"{top}.amaranth.v")
    ports = simdevice.top.module_ports
    assert sorted(ports(netlist.read_text(), top)) == sorted(ports(source.read_text(), top))
    assert "always @*" in source.read_text() and "always @*" not in netlist.read_text()


def test_model_triggers_only_on_clocks(native):
    """Verilator's model of the netlist evaluates nothing on a change of an internal signal:
    its only triggers are the clocks (a wire driving its own bits, which Verilator takes
    for a combinational loop, would add a change-detection trigger evaluated at every
    edge of any clock)."""
    header = native.build.library.parent / "obj" / "Vgnnweave_sim_top___024root.h"
    triggers = set(re.findall(r"__Vtrigprevexpr___TOP__(\w+?)__\d+\b", header.read_text()))
    assert triggers, f"no trigger variables in {header}"
    clocks = {"ap_clk", "ctl_clk"} | {f"unit_clk_{b}" for b in native.clock_edges()}
    assert triggers <= clocks, sorted(triggers - clocks)


def test_idle_units_get_no_clock_edges(native):
    """During an Aggregator job the MacArray's and the Pipeline's clocks stop: they get
    edges only in the wake margin after each register write, not for the job's cycles."""
    units = set(native.unit_edges())
    assert units == {0, 1, 2}, f"the small build's units: {sorted(units)}"
    rng = np.random.default_rng(21)
    job = random_graph_job(rng, 400, 8.0, 32, SUM, False)
    before = native.unit_edges()
    res = simdevice.run_job(job, latency=16, sim=native, config=CONFIG)
    check(job, res, "gated")
    got = {u: n - before[u] for u, n in native.unit_edges().items()}
    regs = simdevice.regmap(CONFIG)
    writes = sum(regs[name].words for name in job.registers()) + 4   # GIE, IER, start, ISR
    assert got[0] >= res.cycles
    for idle in (1, 2):
        assert got[idle] <= writes * 80 < res.cycles, (idle, got, res.cycles)


def test_idle_parts_get_no_clock_edges(native):
    """The Aggregator's reciprocal pipeline, weights' reader and output stage have clocks
    of their own: a sum job leaves the divider's stopped (edges only in the wake margins
    after register writes), a mean job runs it for its descriptors; a job without weights
    leaves the weights' reader stopped, one with weights runs it throughout; the output
    stage's runs while beats pass, not for the whole job."""
    assert set(native.part_edges()) == {"aggregator.recip", "aggregator.output",
                                        "aggregator.weights"}
    rng = np.random.default_rng(23)
    regs = simdevice.regmap(CONFIG)
    got = {}
    for name, reduce, weighted in (("sum", SUM, False), ("mean", MEAN, False),
                                   ("weighted", SUM, True)):
        job = random_graph_job(rng, 400, 8.0, 32, reduce, weighted)
        before = native.part_edges()
        res = simdevice.run_job(job, latency=16, sim=native, config=CONFIG)
        check(job, res, name)
        got[name] = ({k: n - before[k] for k, n in native.part_edges().items()}, res.cycles)
    writes = sum(regs[name].words for name in job.registers()) + 4   # GIE, IER, start, ISR
    (sum_edges, sum_cycles), (mean_edges, mean_cycles) = got["sum"], got["mean"]
    weighted_edges, weighted_cycles = got["weighted"]
    assert sum_edges["aggregator.recip"] <= writes * 80 < sum_cycles
    assert mean_edges["aggregator.recip"] > writes * 80 + 400
    assert weighted_edges["aggregator.weights"] >= weighted_cycles
    for edges, cycles in ((sum_edges, sum_cycles), (mean_edges, mean_cycles)):
        assert edges["aggregator.weights"] <= writes * 80 < cycles, (edges, cycles)
        assert 400 < edges["aggregator.output"] < 0.8 * cycles, (edges, cycles)


def test_control_bus_clock_runs_only_for_register_accesses(native):
    """The control slave's bus side is clocked during register accesses (and a short
    margin after each), not while a job runs: cycles without register traffic give it no
    edge, and a read or a write gives it a few dozen at most."""
    rng = np.random.default_rng(22)
    job = random_graph_job(rng, 200, 6.0, 16, SUM, False)
    res = simdevice.run_job(job, latency=16, sim=native, config=CONFIG)
    check(job, res, "before")
    native.step(200)                       # past every wake margin
    quiet = native.control_edges()
    native.step(5000)
    assert native.control_edges() == quiet
    assert native.reg_read(CTRL_OFFSET) & (1 << CtrlBit.AP_IDLE)
    after_read = native.control_edges()
    assert 0 < after_read - quiet <= 24
    native.reg_write(GIE_OFFSET, 0)
    native.step(200)
    assert 0 < native.control_edges() - after_read <= 100


def _unit_mix(gated: bool) -> dict:
    """Aggregator, MacArray and Pipeline jobs back to back on one simulated device."""
    from gnnweave.generators import rmat
    from gnnweave.host import driver
    from gnnweave.sim.pipeline_unit_bench import unit_problem
    accel, device, owner = driver.open_sim_accel(config=CONFIG, latency=16, mem_size=1 << 22,
                                                 use_pynq=False)
    try:
        device.sim.set_unit_gating(gated)
        rng = np.random.default_rng(5)
        g = rmat(7, 6, seed=2)
        x = rng.integers(-500, 500, size=(g.num_nodes, 24))
        p = rng.integers(-3000, 3000, size=(19, 45))
        q = rng.integers(-3000, 3000, size=(45, 13))
        seen = {"agg0": accel.aggregate(g, x, "mean", 0),
                "mac": accel.mac("fwd", p, q, shift=10, relu=True)}
        pb = unit_problem("1f1b-flush", seed=3, microbatches=2, steps=1)
        run = accel.train_pipeline(pb.inputs, pb.loss_grad, microbatches=pb.microbatches,
                                   weights=pb.masters, schedule=pb.schedule, relu=pb.relu,
                                   lr=0.25, wd=1e-3, mu=0.5, fmt=pb.fmt, dx=True, timeout_s=120)
        seen["pipeline"] = (run.logits, run.dx, run.weights, run.counters)
        seen["dx"] = accel.mac("dx", p, q.T.copy(), shift=9)
        seen["agg1"] = accel.aggregate(g, x, "max", 0)
        seen["agg2"] = accel.aggregate(g, x, "sum", 2)
        edge_weights = rng.integers(-300, 300, size=g.num_edges)
        seen["agg3"] = accel.aggregate(g, x, "sum", 3, edge_weights)
        seen["agg4"] = accel.aggregate(g, x, "mean", 0)
        seen["cycles"] = device.cycles
        return seen
    finally:
        owner.close()


def test_unit_clocks_change_nothing():
    """Every unit job gives the same results, counters and device cycles whether the units'
    clocks stop while idle (the default) or run every cycle."""
    gated, free = _unit_mix(True), _unit_mix(False)
    assert gated["cycles"] == free["cycles"]
    for key in ("agg0", "mac", "dx", "agg1", "agg2", "agg3", "agg4"):
        (out_g, cnt_g), (out_f, cnt_f) = gated[key], free[key]
        np.testing.assert_array_equal(out_g, out_f, err_msg=key)
        assert cnt_g == cnt_f, key
    for a, b in zip(gated["pipeline"][:3], free["pipeline"][:3]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert gated["pipeline"][3] == free["pipeline"][3]


def test_device_package_imports_no_bench():
    """The simulated device is a product, not a test bench: nothing in gnnweave.sim.device
    imports a bench module (or the verify front end built on them)."""
    import ast
    from pathlib import Path
    root = Path(simdevice.__file__).parent
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names
                      if n.rsplit(".", 1)[-1].endswith("_bench") or n.endswith("sim.verify")
                      or n.endswith("sim.tb")]
    assert found == []


def test_profile_run_covers_only_the_reductions_a_build_has():
    """A PGO build's profile run would stop on a job its build refuses (``small-sum`` has
    no divider and no comparator)."""
    from gnnweave.sim.device.jobs import pgo_jobs
    assert {job[1] for job in pgo_jobs("small")} == {"sum", "mean", "max"}
    assert [job[1] for job in pgo_jobs("small-sum")] == ["sum", "sum"]
