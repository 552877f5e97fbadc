"""One Aggregator job on the simulated accelerator, from the registers to the result rows:
:func:`run_job` (also the profile run of the native build, :func:`pgo_train`)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnweave import contract

from .build import NativeBuild, bus_bytes
from .native import NativeAccelerator


@dataclass
class NativeJobResult:
    out: np.ndarray           # [N, F] int64 from the output rows
    counters: dict            # every status register of the map, by name
    status: int
    cycles: int               # harness cycles from the ap_start write to the interrupt
    wall_seconds: float       # host time of the run (start to done)
    memory: np.ndarray        # the image after the run
    faults: int               # beats outside the memory, malformed bursts and bursts
                              # outside the job's configured buffers in this run
    first_fault: str          # the first of the device's lifetime (clear_faults resets)
    timed_out: bool = False
    region_violations: int = 0  # bursts outside the job's configured buffers


def regmap(config: str):
    """The register map of the named build's accelerator top."""
    from gnnweave.hw.accelerator import build_regmap
    return build_regmap(config)


def write_register(sim: NativeAccelerator, reg, value: int):
    """A register of the map (32 or 64 bits, low word first)."""
    for i, word in enumerate(contract.split_words(value, contract.DATA_WIDTH * reg.words)):
        sim.reg_write(reg.offset + contract.WORD_BYTES * i, word)


def read_register(sim: NativeAccelerator, reg) -> int:
    return contract.join_words(sim.reg_read(reg.offset + contract.WORD_BYTES * i)
                               for i in range(reg.words))


def job_buffers(job) -> tuple[list, list]:
    """The buffers an :class:`~gnnweave.layout.AggregateJob` configures: ``(read, write)``
    lists of ``(addr, size)`` (weights only when the job uses them)."""
    regs = job.registers()
    reads = [(regs[f"{n}_addr"], regs[f"{n}_size"]) for n in ("indptr", "indices", "feat")]
    if regs.get("use_weights"):
        reads.append((regs["weights_addr"], regs["weights_size"]))
    return reads, [(regs["out_addr"], regs["out_size"])]


def run_job(job, *, latency: int = 32, config: str = "small", max_cycles: int | None = None,
            sim: NativeAccelerator | None = None, max_outstanding: int = 64) -> NativeJobResult:
    """Run one :class:`~gnnweave.layout.AggregateJob` on the native device (a fresh one
    unless ``sim`` is given; its memory is replaced by the job's image). Every burst is
    checked against the buffers the job configures (:func:`job_buffers`)."""
    from gnnweave.contract import (
        CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, CtrlBit, GieBit, IrqBit,
    )
    regs = regmap(config)
    image = job.memory_image()
    if sim is None:
        sim = NativeAccelerator(image, job.base_addr, latency=latency, config=config,
                               max_outstanding=max_outstanding)
    else:
        sim.set_memory(image, job.base_addr)
        sim.set_latency(latency, max_outstanding)
    reads, writes = job_buffers(job)
    sim.set_regions(read=reads, write=writes)
    before = sim.stats()
    for name, value in job.registers().items():
        write_register(sim, regs[name], value)
    sim.reg_write(GIE_OFFSET, GieBit.ENABLE.mask)
    sim.reg_write(IER_OFFSET, IrqBit.AP_DONE.mask)
    if max_cycles is None:
        beats = job.num_edges * -(-job.row_bytes // sim.build.bus_bytes) + job.num_nodes * 4
        max_cycles = 20_000 + 20 * beats * max(1, latency // 8)
    t0 = time.perf_counter()
    c0 = sim.cycles
    sim.reg_write(CTRL_OFFSET, CtrlBit.AP_START.mask)
    sim.run_until_interrupt(max_cycles)
    wall = time.perf_counter() - t0
    cycles = sim.cycles - c0
    timed_out = not sim.interrupt
    sim.reg_write(ISR_OFFSET, IrqBit.AP_DONE.mask)    # toggle ap_done back off
    sim.reg_read(CTRL_OFFSET)          # clear-on-read ap_done
    counters = {r.name: read_register(sim, r) for r in regs if r.access.name == "RO"}
    after = sim.stats()
    sim.set_regions(read=[], write=[])
    outside = after["region_violations"] - before["region_violations"]
    faults = (after["faults"] - before["faults"]) + \
        (after["protocol_errors"] - before["protocol_errors"]) + outside
    return NativeJobResult(out=job.read_output(image), counters=counters,
                           status=int(counters["status"]), cycles=cycles, wall_seconds=wall,
                           memory=image, faults=faults,
                           first_fault=sim.first_fault(), timed_out=timed_out,
                           region_violations=outside)


#: The profile run's jobs: ``(R-MAT scale, reduction, weighted, feature width)``.
PGO_JOBS = ((10, "sum", False, 16), (9, "mean", False, 24), (9, "max", False, 16),
            (9, "sum", True, 8))


def pgo_jobs(config: str) -> list[tuple]:
    """The :data:`PGO_JOBS` whose reduction the build ``config`` has (a build without
    ``mean`` or ``max`` refuses those jobs)."""
    from gnnweave.buildconfig import get_build
    ops = get_build(config).aggregator.reduce_ops
    return [job for job in PGO_JOBS if job[1] in ops]


def pgo_train(library: str, config: str):
    """The profile run of a PGO build (in a child process, which writes the profile when it
    exits): a few short Aggregator jobs covering every reduction the build has
    (:func:`pgo_jobs`), weights and the control path, each checked against the golden
    model."""
    from gnnweave.generators import rmat
    from gnnweave.golden.aggregate import Reduce, aggregate_raw
    from gnnweave.layout import AggregateJob
    build = NativeBuild(Path(library), config, bus_bytes(config), "pgo", True, 0.0)
    rng = np.random.default_rng(1)
    sim = None
    for scale, reduce, weighted, feat in pgo_jobs(config):
        graph = rmat(scale, 8, seed=scale)
        x = rng.integers(-600, 601, size=(graph.num_nodes, feat), dtype=np.int64)
        w = rng.integers(-32768, 32768, size=graph.num_edges, dtype=np.int64) if weighted else None
        job = AggregateJob(indptr=graph.indptr, indices=graph.indices, x=x,
                           reduce=int(Reduce.parse(reduce)), shift=14 if weighted else 0, weights=w)
        if sim is None:
            sim = NativeAccelerator(job.memory_image(), job.base_addr, config=config, build=build)
        res = run_job(job, latency=32, config=config, sim=sim)
        gold = aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce.parse(reduce),
                             shift=job.shift, out_width=16, weights=job.weights)
        if res.timed_out or res.faults or not np.array_equal(res.out, gold.out):
            raise SystemExit(f"profile run: wrong result on rmat:{scale}:8 {reduce}")
    sim.close()
