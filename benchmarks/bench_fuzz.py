"""Fuzz campaign: thousands of random aggregate jobs on the simulated device, a share of
them malformed, behind a board-like memory (out-of-order responses across IDs, random
latency, open-row DRAM) with injected SLVERR/DECERR on some runs.

Each job is one of

* ``good``: a random graph through the driver (``SimAccel.aggregate``), compared word by
  word with the golden model;
* ``driver``: malformed arguments the driver must refuse with a one-line ``ValueError``
  before touching the device (indptr not monotone or not ending at E, an index that is
  not a node, x of the wrong shape or range, too many features, a bad shift or reduce,
  weights of the wrong count);
* ``hardware``: a job written straight into device memory and registers (the driver never
  builds these), malformed in its indptr (not monotone, past E), indices (not nodes),
  sizes (a buffer too small, a stream ending inside a beat), strides (not whole beats,
  shorter than a row), bases (not beat aligned, or base + size past the address space),
  feat_dim or reduce_op; the status bits, counters and output must be the golden
  model's, or ``config_error`` with no memory traffic where the contract says so;
* ``axi_error``: a good job with an injected error response on a random read or write
  burst: the driver must raise ``AcceleratorError`` naming axi_error, and the device must
  stay usable (the next job is checked like any other).

The device counts every burst outside the buffers the host configured (``check_buffers``)
or outside its memory; both must stay 0, as must mismatches against golden and hung runs.

    python -m benchmarks.bench_fuzz [OUT_DIR] [--jobs N] [--seed S] [--config C]
    make bench BENCH=fuzz
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gnnweave import contract

DEFAULT_JOBS = 2000
CONFIG = "small"
#: shares of the job kinds (the rest are good jobs)
SHARES = {"driver": 0.15, "hardware": 0.25, "axi_error": 0.05}
#: CTRL polls (each advances the device by poll_cycles or to the interrupt) before a run
#: counts as hung
MAX_POLLS = 64


class Campaign:
    """One simulated device, its driver, and the tallies of a run."""

    def __init__(self, config: str, seed: int, latency: int = 16):
        from gnnweave.host.driver import SimAccel
        from gnnweave.hw.configs import get_config
        from gnnweave.sim.device import SimDevice
        self.config = config
        self.agg = get_config(config)
        self.device = SimDevice(1 << 24, config=config, latency=latency, check_buffers=True,
                                poll_cycles=1 << 12)
        self.device.set_memory_model(reorder=True, jitter=48, dram=True, seed=seed)
        self.accel = SimAccel(self.device)
        self.rng = np.random.default_rng(seed)
        self.jobs = Counter()
        self.caught = Counter()
        self.mismatches: list[str] = []
        self.hangs = 0
        self.cycles = 0

    def close(self):
        self.device.close()

    # ------------------------------------------------------------------ random jobs
    def random_graph(self, max_nodes: int = 48):
        rng = self.rng
        n = int(rng.integers(0, max_nodes + 1))
        degrees = rng.poisson(float(rng.uniform(0.5, 5.0)), size=n)
        indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
        e = int(indptr[-1])
        indices = rng.integers(0, max(n, 1), size=e).astype(np.int64)
        f = int(rng.integers(1, self.agg.max_feat_dim + 1))
        big = rng.random() < 0.2            # saturating sums now and then
        x = rng.integers(-32768 if big else -300, 32768 if big else 301, size=(n, f)).astype(np.int64)
        weights = rng.integers(-32768, 32768, size=e).astype(np.int64) if rng.random() < 0.4 else None
        reduce = ("sum", "mean", "max")[int(rng.integers(0, 3))]
        shift = int(rng.integers(0, 20)) if weights is not None else int(rng.integers(0, 4))
        return indptr, indices, x, weights, reduce, shift

    # ------------------------------------------------------------------ good jobs
    def good(self, kind: str = "good"):
        from gnnweave.golden.aggregate import Reduce, aggregate_raw
        from gnnweave.graph import CSRGraph
        indptr, indices, x, weights, reduce, shift = self.random_graph()
        gold = aggregate_raw(indptr, indices, x, reduce=Reduce.parse(reduce), shift=shift,
                             out_width=16, weights=weights)
        out, counters = self.accel.aggregate(CSRGraph(indptr, indices, len(indptr) - 1), x, reduce,
                                             shift, weights)
        self.cycles += counters["busy_cycles"]
        if not np.array_equal(out, gold.out):
            bad = np.argwhere(out != gold.out)
            self.mismatch(f"{kind}: {bad.shape[0]} words differ, first out{tuple(bad[0])}")
        for name, want in (("edges", gold.edges), ("saturations", gold.saturations)):
            if counters[name] != want:
                self.mismatch(f"{kind}: counter {name} = {counters[name]}, golden {want}")

    def axi_error(self):
        from gnnweave.host.driver import AcceleratorError
        kind = "read" if self.rng.random() < 0.6 else "write"
        resp = "SLVERR" if self.rng.random() < 0.5 else "DECERR"
        before = self.device.stats()["injected_errors"]
        self.device.inject_error(kind, after=int(self.rng.integers(0, 6)), resp=resp)
        try:
            self.good("axi_error")
        except AcceleratorError as exc:
            if "axi_error" not in str(exc):
                self.mismatch(f"axi_error: the driver's error does not name axi_error: {exc}")
            self.caught[f"axi_error:{kind}"] += 1
            return
        finally:
            self.device.sim.clear_injections()
        if self.device.stats()["injected_errors"] != before:
            self.mismatch(f"axi_error: an injected {resp} on a {kind} went unreported")
        # else the run had fewer bursts than the chosen one: nothing was injected

    # ------------------------------------------------------------------ the driver refuses
    def driver(self):
        indptr, indices, x, weights, reduce, shift = self.random_graph()
        n, e = len(indptr) - 1, len(indices)
        rng = self.rng
        choices = ["indptr_end", "feat_dim", "x_rows", "x_range", "shift", "reduce"]
        if n >= 2 and e >= 1:
            choices += ["indptr_order", "index"]
        if e:
            choices.append("weights_count")
        what = choices[int(rng.integers(0, len(choices)))]
        indptr, indices, x = indptr.copy(), indices.copy(), x.copy()
        if what == "indptr_order":
            v = int(rng.integers(1, n))
            indptr[v] = indptr[v + 1] + 1
        elif what == "indptr_end":
            indptr[-1] += 1
        elif what == "index":
            indices[int(rng.integers(0, e))] = n + int(rng.integers(0, 1000))
        elif what == "feat_dim":
            x = np.zeros((n, self.agg.max_feat_dim + 1), np.int64)
        elif what == "x_rows":
            x = np.zeros((n + 1, x.shape[1]), np.int64)
        elif what == "x_range":
            if n:
                x[0, 0] = 40000
            else:
                x = np.zeros((0, 3, 1), np.int64)
        elif what == "shift":
            shift = 64
        elif what == "reduce":
            reduce = "median"
        elif what == "weights_count":
            weights = np.zeros(e + 1, np.int64)
        try:
            self.accel.aggregate(_Graph(indptr, indices), x, reduce, shift, weights)
        except ValueError as exc:
            message = str(exc)
            if "\n" in message or not message:
                self.mismatch(f"driver/{what}: not a one-line message: {message!r}")
            self.caught[f"driver:{what}"] += 1
            return
        self.mismatch(f"driver/{what}: malformed job accepted")

    # ------------------------------------------------------------------ raw hardware jobs
    def hardware(self):
        indptr, indices, x, weights, reduce, shift = self.random_graph()
        n, e = len(indptr) - 1, len(indices)
        rng = self.rng
        bpb = self.agg.bytes_per_beat
        row = -(-2 * x.shape[1] // bpb) * bpb
        kw = dict(indptr=indptr.copy(), indices=indices.copy(), x=x, weights=weights,
                  reduce=("sum", "mean", "max").index(reduce), shift=shift, bus_bytes=bpb)
        choices = ["feat_small", "out_small", "indptr_small", "feat_stride_odd", "out_stride_short",
                   "misaligned", "reduce_op", "feat_dim_zero", "feat_dim_big", "base_wraps"]
        if n >= 2:
            choices += ["indptr_order", "indptr_past_end"]
        if e:
            choices += ["index", "indices_part_beat"]
        what = choices[int(rng.integers(0, len(choices)))]
        wrap = None
        if what == "indptr_order" and indptr[-1] > 0:
            v = int(rng.integers(1, n))
            kw["indptr"][v] = int(rng.integers(indptr[v + 1] + 1, indptr[v + 1] + 50))
        elif what == "indptr_past_end":
            kw["indptr"][int(rng.integers(1, n + 1))] = e + int(rng.integers(1, 100))
        elif what == "index":
            for i in rng.integers(0, e, size=int(rng.integers(1, 4))):
                kw["indices"][int(i)] = n + int(rng.integers(0, 1 << 31))
        elif what == "feat_small":
            kw["sizes"] = {"feat": max(0, (n - 1) * row + row - bpb * int(rng.integers(1, 3)))}
        elif what == "out_small":
            kw["sizes"] = {"out": max(0, n * row - bpb)}
        elif what == "indptr_small":
            kw["sizes"] = {"indptr": max(0, -(-4 * (n + 1) // bpb) * bpb - bpb)}
        elif what == "indices_part_beat":
            kw["sizes"] = {"indices": 4 * e if (4 * e) % bpb else max(0, 4 * e - 4)}
        elif what == "feat_stride_odd":
            kw["feat_stride"] = row + int(rng.integers(1, bpb))
        elif what == "out_stride_short":
            kw["out_stride"] = row - bpb if row > bpb else bpb // 2
        elif what == "misaligned":
            name = ("indptr", "indices", "feat", "out")[int(rng.integers(0, 4))]
            kw["addr_offsets"] = {name: 2 * int(rng.integers(1, bpb // 2))}
        elif what == "reduce_op":
            kw["registers_override"] = {"reduce_op": 3}
        elif what == "feat_dim_zero":
            kw["registers_override"] = {"feat_dim": 0}
        elif what == "feat_dim_big":
            kw["registers_override"] = {"feat_dim": self.agg.max_feat_dim + int(rng.integers(1, 200))}
        elif what == "base_wraps":
            wrap = ("indptr", "indices", "feat", "out")[int(rng.integers(0, 4))]
        self.run_raw(kw, what, wrap)

    def run_raw(self, kw: dict, what: str, wrap: str | None):
        from gnnweave.layout import AggregateJob
        probe = AggregateJob(**kw)
        block = self.device.allocate((probe.image_size,), np.uint8)
        try:
            job = AggregateJob(**kw, base_addr=int(block.device_address))
            size = job.registers()[f"{wrap}_size"] if wrap is not None else 0
            if size > job.bus_bytes:    # base + size past the end of the address space
                job.registers_override[f"{wrap}_addr"] = (1 << self.agg.addr_width) - job.bus_bytes
            else:                       # nothing to wrap: a well-formed job
                wrap = None
            image = job.memory_image()
            block[:] = image
            before = self.device.stats()
            status, counters = self.program_and_run(job.registers())
            after = self.device.stats()
            memory = np.array(block)
        finally:
            block.freebuffer()
        if status is None:
            self.hangs += 1
            self.mismatch(f"hardware/{what}: no ap_done within {MAX_POLLS} polls")
            self.accel.recover()
            return
        self.cycles += counters["busy_cycles"]
        flags = {f.name.lower(): bool(status & f) for f in contract.AggregatorStatus}
        expect_config = job.config_error_expected(self.agg.max_feat_dim) or wrap is not None
        problems = []
        if len(job.stray_writes(memory)):
            problems.append("bytes written outside the output rows")
        if flags["addr_fault"] or flags["axi_error"]:
            problems.append(f"unexpected status 0x{status:x}")
        if expect_config:
            if not flags["config_error"]:
                problems.append("config_error expected, not set")
            if after["ar_bursts"] != before["ar_bursts"] or after["aw_bursts"] != before["aw_bursts"]:
                problems.append("memory traffic after a config error")
            else:
                self.caught[f"config_error:{what}"] += 1
        else:
            problems += self.check_golden(job, memory, flags, counters, what)
        for p in problems:
            self.mismatch(f"hardware/{what}: {p}")

    def check_golden(self, job, memory, flags, counters, what) -> list[str]:
        from gnnweave.golden.aggregate import Reduce, aggregate_raw
        gold = aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce(int(job.reduce)),
                             shift=int(job.shift), out_width=16, weights=job.weights,
                             num_edges=int(job.num_edges))
        problems = []
        if flags["config_error"]:
            return [f"unexpected config_error (registers {job.registers()})"]
        out = job.read_output(memory)
        if not np.array_equal(out, gold.out):
            problems.append(f"{int(np.count_nonzero(out != gold.out))} output words differ")
        for name, want in (("edges", gold.edges), ("rejected_indices", gold.rejected),
                           ("saturations", gold.saturations)):
            if counters[name] != want:
                problems.append(f"counter {name} = {counters[name]}, golden {want}")
        if flags["bad_indptr"] != bool(gold.bad_indptr):
            problems.append(f"bad_indptr = {flags['bad_indptr']}, golden {gold.bad_indptr}")
        if flags["index_rejected"] != (gold.rejected > 0):
            problems.append(f"index_rejected = {flags['index_rejected']}, golden {gold.rejected}")
        if not problems:
            for flag in ("bad_indptr", "index_rejected"):
                if flags[flag]:
                    self.caught[f"{flag}:{what}"] += 1
        return problems

    def program_and_run(self, registers: dict):
        """Registers through the device's register interface, start, wait for ap_done;
        -> (status, counters), or (None, None) when the run hangs."""
        from gnnweave.contract import (
            CTRL_OFFSET, DATA_WIDTH, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, UNIT_REGISTER, WORD_BYTES,
            CtrlBit, GieBit, IrqBit, Unit, join_words, split_words,
        )
        dev, regmap = self.device, self.device.regmap
        base = dev.control_base

        def write(offset, value):
            dev.write_registers(base + offset, int(value).to_bytes(4, "little"))

        def read(offset):
            return int.from_bytes(dev.read_registers(base + offset, 4), "little")

        unit = UNIT_REGISTER[0]
        registers = {unit: Unit.AGGREGATOR, **registers} if unit in regmap else registers
        for name, value in registers.items():
            reg = regmap[name]
            for w, word in enumerate(split_words(value, DATA_WIDTH * reg.words)):
                write(reg.offset + WORD_BYTES * w, word)
        write(GIE_OFFSET, GieBit.ENABLE.mask)
        write(IER_OFFSET, IrqBit.AP_DONE.mask)
        write(CTRL_OFFSET, CtrlBit.AP_START.mask)
        for _ in range(MAX_POLLS):
            if read(CTRL_OFFSET) & CtrlBit.AP_DONE.mask:
                break
        else:
            return None, None
        if read(ISR_OFFSET) & IrqBit.AP_DONE.mask:
            write(ISR_OFFSET, IrqBit.AP_DONE.mask)

        def read_reg(reg):
            return join_words(read(reg.offset + WORD_BYTES * w) for w in range(reg.words))
        counters = {r.name: read_reg(r) for r in regmap if r.access.name == "RO"}
        return counters["status"], counters

    # ------------------------------------------------------------------ bookkeeping
    def mismatch(self, text: str):
        self.mismatches.append(text)

    def one(self):
        r = self.rng.random()
        kind = "good"
        for name, share in SHARES.items():
            if r < share:
                kind = name
                break
            r -= share
        self.jobs[kind] += 1
        getattr(self, kind)()

    def report(self) -> dict:
        faults, first = self.device.memory_faults()
        stats = self.device.stats()
        return {
            "config": self.config,
            "jobs_run": int(sum(self.jobs.values())),
            "jobs_by_kind": dict(self.jobs),
            "errors_caught": int(sum(self.caught.values())),
            "errors_caught_by_kind": dict(sorted(self.caught.items())),
            "out_of_buffer_accesses": int(stats["region_violations"]),
            "memory_faults": int(faults - stats["region_violations"]),
            "first_fault": first,
            "mismatches": len(self.mismatches),
            "first_mismatches": self.mismatches[:10],
            "hung_runs": self.hangs,
            "busy_cycles": int(self.cycles),
            "memory": {"reordered_bursts": int(stats["reordered_bursts"]),
                       "row_misses": int(stats["row_misses"]),
                       "injected_errors": int(stats["injected_errors"]),
                       "read_bursts": int(stats["ar_bursts"]),
                       "write_bursts": int(stats["aw_bursts"])},
        }


class _Graph:
    """Just ``indptr`` and ``indices`` (what the driver reads), without CSRGraph's own
    validation, so the driver's checks are the ones exercised."""

    def __init__(self, indptr, indices):
        self.indptr, self.indices = indptr, indices


def campaign(jobs: int = DEFAULT_JOBS, seed: int = 0, config: str = CONFIG,
             progress: bool = True) -> dict:
    """Run ``jobs`` random jobs on a fresh simulated device -> the JSON report."""
    from gnnweave.sim.device import build_native
    build_native(config)
    start = time.perf_counter()
    c = Campaign(config, seed)
    try:
        for _ in tqdm(range(int(jobs)), desc=f"fuzz {config}", unit="job", disable=not progress):
            c.one()
        report = c.report()
    finally:
        c.close()
    report.update(seed=int(seed), seconds=round(time.perf_counter() - start, 1),
                  targets={"out_of_buffer_accesses": 0, "memory_faults": 0, "mismatches": 0,
                           "hung_runs": 0})
    report["passed"] = all(report[k] == 0 for k in report["targets"])
    return report


def run(out_dir=None, jobs: int = DEFAULT_JOBS, seed: int = 0, config: str = CONFIG) -> dict:
    report = campaign(jobs, seed, config)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "bench_fuzz.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="benchmarks/results/fuzz")
    ap.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=CONFIG)
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, not {args.jobs}")
    report = run(args.out_dir, args.jobs, args.seed, args.config)
    print(json.dumps({k: v for k, v in report.items() if k != "first_mismatches"}, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
