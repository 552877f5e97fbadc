"""A pipeline's stages split over several devices (Pipelines linked by the bench)."""
from __future__ import annotations

import numpy as np

from gnnweave.golden.pipeline import Schedule
from .host import RtlRun, measured_bubble
from .problems import compare_problem, problem_build, random_problem, run_problem_rtl


class DevicesIO:
    """Several devices, each a Pipeline holding a slice of the global pipeline (ports
    ``d<d>_<port>``, see :func:`split_pipelines`), seen by :class:`PipelineHost` as one
    pipeline: global stage ``g`` maps to its device's local stage, ``stage_offset`` gives
    each device its first global stage, the global ``act_in`` / ``grad_out`` are the first
    device's, ``act_out`` / ``grad_in`` the last device's, and ``done`` is reported once
    every device has finished. Neighbouring devices are linked act_out -> act_in and
    grad_out -> grad_in by the bench: a segment that leaves one device at cycle ``c`` is
    offered to the next at cycle ``c + link_delay`` (a link with that latency and enough
    buffering; ``link_delay >= 1``)."""

    def __init__(self, base, device_stages, link_delay: int = 1):
        from collections import deque
        if link_delay < 1:
            raise ValueError(f"link_delay must be >= 1 cycle, got {link_delay}")
        self.base = base
        self.ks = [int(k) for k in device_stages]
        self.offsets = [sum(self.ks[:d]) for d in range(len(self.ks))]
        self.delay = int(link_delay)
        # per boundary b (device b -> b+1): activations downstream, gradients upstream
        self.queues = [{"act": deque(), "grad": deque()} for _ in self.ks[:-1]]
        self.offered = [{"act": False, "grad": False} for _ in self.ks[:-1]]
        self.finished = [False] * len(self.ks)
        self.cycle = 0

    def _links(self, b):
        """(source port, sink port) of each link of boundary ``b``."""
        return {"act": (f"d{b}_act_out", f"d{b + 1}_act_in"),
                "grad": (f"d{b + 1}_grad_out", f"d{b}_grad_in")}

    def _device_names(self, name):
        last = len(self.ks) - 1
        if name.startswith("s") and "_" in name and name[1:name.index("_")].isdigit():
            g, rest = int(name[1:name.index("_")]), name[name.index("_"):]
            for d, (off, k) in enumerate(zip(self.offsets, self.ks)):
                if off <= g < off + k:
                    return [f"d{d}_s{g - off}{rest}"]
            raise ValueError(f"stage {g} is on no device (devices hold {self.ks} stages)")
        head = name.split(".")[0]
        if head in ("act_in", "grad_out"):
            return [f"d0_{name}"]
        if head in ("act_out", "grad_in"):
            return [f"d{last}_{name}"]
        return [f"d{d}_{name}" for d in range(len(self.ks))]

    def set(self, name, value):
        if name == "stage_offset":
            for d, off in enumerate(self.offsets):
                self.base.set(f"d{d}_stage_offset", int(value) + off)
            return
        if name == "start" and value:
            self.finished = [False] * len(self.ks)
        for n in self._device_names(name):
            self.base.set(n, value)

    def get(self, name) -> int:
        if name == "done":
            for d in range(len(self.ks)):
                self.finished[d] = self.finished[d] or bool(self.base.get(f"d{d}_done"))
            return int(all(self.finished))
        names = self._device_names(name)
        return self.base.get(names[0])

    def idle_links(self):
        for b in range(len(self.queues)):
            for src, dst in self._links(b).values():
                self.base.set(f"{dst}.valid", 0)

    def drive_links(self):
        for b, q in enumerate(self.queues):
            for kind, (src, dst) in self._links(b).items():
                self.base.set(f"{src}.ready", 1)
                head = q[kind][0] if q[kind] else None
                offer = head is not None and head[0] <= self.cycle
                self.offered[b][kind] = offer
                self.base.set(f"{dst}.valid", int(offer))
                if offer:
                    self.base.set(f"{dst}.payload", head[1])

    def sample_links(self):
        for b, q in enumerate(self.queues):
            for kind, (src, dst) in self._links(b).items():
                if self.offered[b][kind] and self.base.get(f"{dst}.ready"):
                    q[kind].popleft()
                if self.base.get(f"{src}.valid"):
                    q[kind].append((self.cycle + self.delay, self.base.get(f"{src}.payload")))
        self.cycle += 1


def _same_run(a: RtlRun, b: RtlRun, stages: int, n: int) -> list[str]:
    bad = []
    for s in range(stages):
        for i in range(n):
            if not np.array_equal(a.outputs[s].get(i), b.outputs[s].get(i)):
                bad.append(f"stage {s} output of microbatch {i}")
            if not np.array_equal(a.input_grads[s].get(i), b.input_grads[s].get(i)):
                bad.append(f"stage {s} input gradient of microbatch {i}")
        if not np.array_equal(a.masters[s], b.masters[s]):
            bad.append(f"stage {s} final master weights")
    return bad


def verify_split_pipeline(devices=(2, 2), microbatches: int = 4, schedule="1f1b-flush",
                          steps: int = 2, *, link_delays=(1, 16), dim: int = 8, rows: int = 8,
                          seed: int = 0, simulator: str = "verilator", build: dict | None = None) -> dict:
    """The stages of one pipeline split over ``len(devices)`` Pipelines (device ``d`` holds
    ``devices[d]`` consecutive stages, told its place by ``stage_offset`` /
    ``total_stages``), linked end to end by the bench with each fixed link delay in
    ``link_delays`` (cycles), against golden and against one Pipeline holding all the
    stages: every stage output and input gradient of every microbatch and the final
    master weights must be identical."""
    p = sum(devices)
    problem = random_problem(p, microbatches, steps, schedule, dim=dim, rows=rows, seed=seed)
    build = dict(build or problem_build(problem))
    trace = problem.run_golden()
    single = run_problem_rtl(problem, build=build, simulator=simulator)
    result = {"devices": list(devices), "stages": p, "microbatches": microbatches,
              "schedule": Schedule.parse(schedule).cli_name, "steps": steps,
              "single": {"match": not compare_problem(problem, trace, single),
                         "mismatches": compare_problem(problem, trace, single)[:5],
                         "cycles": single.cycles, "bubble_fraction": measured_bubble(single)},
              "split": []}
    for delay in link_delays:
        run = run_problem_rtl(problem, build=build, devices=devices, link_delay=delay,
                              simulator=simulator)
        vs_golden = compare_problem(problem, trace, run)
        vs_single = _same_run(run, single, p, len(problem.inputs))
        result["split"].append({"link_delay": delay, "match_golden": not vs_golden,
                                "match_single_pipeline": not vs_single,
                                "mismatches": (vs_golden + vs_single)[:5], "cycles": run.cycles,
                                "bubble_fraction": measured_bubble(run)})
    result["match"] = result["single"]["match"] and all(
        r["match_golden"] and r["match_single_pipeline"] for r in result["split"])
    return result
