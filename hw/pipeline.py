"""Pipeline: ``K`` :class:`~gnnweave.hw.train_stage.TrainStage` s chained on one device.

Stage ``s``'s ``act_out`` feeds stage ``s+1``'s ``act_in`` (activations downstream) and
stage ``s+1``'s ``grad_out`` feeds stage ``s``'s ``grad_in`` (gradients upstream). The four
end ports are external streams: ``act_in`` (inputs of stage 0), ``act_out`` (last stage's
outputs, e.g. logits to the host), ``grad_in`` (the loss gradient from the host, in the
last stage's backward order) and ``grad_out`` (stage 0's input gradient). A host that
puts neighbouring stages on another device connects those end ports to it (each
device runs a Pipeline whose ``stages``/``stage`` registers give its stages' global
positions through ``stage_offset`` and ``total_stages``).

The schedule (``Schedule`` register: 0 GPipe, 1 1F1B-flush, 2 async 1F1B with weight
stashing) and the hyper-parameters are common to all stages; ``start`` starts all stages,
``done`` pulses when the last one finished. Per-stage counters are exposed as lists.
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out, connect

from .train_stage import TrainStage


class Schedule(enum.Enum, shape=2):
    """Register encoding; equals ``gnnweave.golden.pipeline.Schedule``."""

    GPIPE = 0
    ONEF1B_FLUSH = 1
    ONEF1B_ASYNC = 2


def bubble_formula(schedule: int, stages: int, microbatches: int) -> float:
    """``(p-1)/(m+p-1)`` for the synchronous schedules, 0 for async 1F1B (steady state)."""
    if int(schedule) == Schedule.ONEF1B_ASYNC.value:
        return 0.0
    return (stages - 1) / (microbatches + stages - 1)


class Pipeline(wiring.Component):
    def __init__(self, num_stages: int, **stage_kwargs):
        if not 1 <= num_stages <= 8:
            raise ValueError(f"num_stages must be in 1..8, got {num_stages}")
        self.num_stages = num_stages
        self.stage_list = [TrainStage(**stage_kwargs) for _ in range(num_stages)]
        first, last = self.stage_list[0], self.stage_list[-1]
        sig = first.signature.members
        ib = first.index_bits
        super().__init__({
            "start": In(1), "busy": Out(1), "done": Out(1),
            "schedule": In(2), "microbatches": In(8), "steps": In(16),
            "total_stages": In(4), "stage_offset": In(4),
            "act_in": In(sig["act_in"].signature), "act_out": Out(sig["act_out"].signature),
            "grad_in": In(sig["grad_in"].signature), "grad_out": Out(sig["grad_out"].signature),
        })

    def elaborate(self, platform):
        m = Module()
        stages = self.stage_list
        for i, st in enumerate(stages):
            m.submodules[f"stage{i}"] = st
            m.d.comb += [st.start.eq(self.start), st.schedule.eq(self.schedule),
                         st.microbatches.eq(self.microbatches), st.steps.eq(self.steps),
                         st.stages.eq(self.total_stages), st.stage.eq(self.stage_offset + i)]
        for up, down in zip(stages[:-1], stages[1:]):
            connect(m, up.act_out, down.act_in)
            connect(m, down.grad_out, up.grad_in)
        def forward(src, dst):
            m.d.comb += [dst.valid.eq(src.valid), dst.payload.eq(src.payload), src.ready.eq(dst.ready)]
        forward(self.act_in, stages[0].act_in)
        forward(stages[-1].act_out, self.act_out)
        forward(self.grad_in, stages[-1].grad_in)
        forward(stages[0].grad_out, self.grad_out)
        busy = Signal()
        m.d.comb += busy.eq(sum(st.busy for st in stages) != 0)
        was_busy = Signal()
        m.d.sync += was_busy.eq(busy)
        m.d.comb += [self.busy.eq(busy), self.done.eq(was_busy & ~busy)]
        return m
