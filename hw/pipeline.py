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
from amaranth.lib import enum, stream, wiring
from amaranth.lib.wiring import In, Out

from gnnweave.contract import PIPELINE_STAGE_COUNTERS, names

from .axi import SkidBuffer
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


#: Per-stage configuration inputs forwarded from the top as ``s<i>_<name>``.
STAGE_CONFIG = ("rows", "d_in", "d_out", "relu", "fwd_shift", "dx_shift", "dw_shift", "lr", "wd", "mu",
                "dx_first")
#: Per-stage host access inputs (while idle) forwarded as ``s<i>_<name>``: master weights
#: (``w_*``, read back on ``s<i>_w_rd_data``) and SGD velocity (``v_*``, ``s<i>_v_rd_data``).
STAGE_HOST_INPUTS = ("w_wr_en", "w_row", "w_word", "w_wr_data", "v_wr_en", "v_row", "v_word", "v_wr_data")
#: Per-stage counters exposed as ``s<i>_<name>``.
STAGE_COUNTERS = names(PIPELINE_STAGE_COUNTERS)


class Pipeline(wiring.Component):
    """``num_stages`` stages; every port of the chain is a top-level port (flat names, so the
    Verilog top is what a bench or a register block drives): the four end streams, per
    stage ``s<i>_<config>`` inputs, the master-weight access port ``s<i>_w_*``, the velocity
    access port ``s<i>_v_*``, the counters
    ``s<i>_<counter>`` and monitor taps of the inner streams (``s<i>_act_fire`` /
    ``s<i>_act_data``: a segment left stage ``i`` downstream; ``s<i>_grad_*`` upstream)."""

    def __init__(self, num_stages: int, **stage_kwargs):
        if not 1 <= num_stages <= 8:
            raise ValueError(f"num_stages must be in 1..8, got {num_stages}")
        self.num_stages = num_stages
        self.stage_list = [TrainStage(**stage_kwargs) for _ in range(num_stages)]
        first = self.stage_list[0]
        sig = first.signature.members
        members = {
            "start": In(1), "busy": Out(1), "done": Out(1),
            "schedule": In(2), "microbatches": In(8), "steps": In(16),
            "total_stages": In(4), "stage_offset": In(4),
        }
        seg_shape = sig["act_out"].signature.members["payload"].shape
        seg = stream.Signature(seg_shape)
        members.update({"act_in": In(seg), "act_out": Out(seg), "grad_in": In(seg), "grad_out": Out(seg)})
        for i in range(num_stages):
            for name in STAGE_CONFIG + STAGE_HOST_INPUTS:
                members[f"s{i}_{name}"] = In(sig[name].shape, init=sig[name].init)
            members[f"s{i}_w_rd_data"] = Out(sig["w_rd_data"].shape)
            members[f"s{i}_v_rd_data"] = Out(sig["v_rd_data"].shape)
            for name in STAGE_COUNTERS:
                members[f"s{i}_{name}"] = Out(sig[name].shape)
            members[f"s{i}_act_fire"] = Out(1)
            members[f"s{i}_act_data"] = Out(seg_shape)
            members[f"s{i}_grad_fire"] = Out(1)
            members[f"s{i}_grad_data"] = Out(seg_shape)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        stages = self.stage_list
        for i, st in enumerate(stages):
            m.submodules[f"stage{i}"] = st
            m.d.comb += [st.start.eq(self.start), st.schedule.eq(self.schedule),
                         st.microbatches.eq(self.microbatches), st.steps.eq(self.steps),
                         st.stages.eq(self.total_stages), st.stage.eq(self.stage_offset + i)]
            for name in STAGE_CONFIG + STAGE_HOST_INPUTS:
                m.d.comb += getattr(st, name).eq(getattr(self, f"s{i}_{name}"))
            m.d.comb += getattr(self, f"s{i}_w_rd_data").eq(st.w_rd_data)
            m.d.comb += getattr(self, f"s{i}_v_rd_data").eq(st.v_rd_data)
            for name in STAGE_COUNTERS:
                m.d.comb += getattr(self, f"s{i}_{name}").eq(getattr(st, name))
            m.d.comb += [
                getattr(self, f"s{i}_act_fire").eq(st.act_out.valid & st.act_out.ready),
                getattr(self, f"s{i}_act_data").eq(st.act_out.payload),
                getattr(self, f"s{i}_grad_fire").eq(st.grad_out.valid & st.grad_out.ready),
                getattr(self, f"s{i}_grad_data").eq(st.grad_out.payload),
            ]
        # every stream into or out of a stage passes a register slice: no path runs from
        # one stage's logic into its neighbour's (or the unit's), in either direction
        seg_shape = stages[0].act_out.payload.shape()

        def slice_(name, src, dst):
            m.submodules[name] = skid = SkidBuffer(seg_shape)
            m.d.comb += [skid.i.valid.eq(src.valid), skid.i.payload.eq(src.payload),
                         src.ready.eq(skid.i.ready),
                         dst.valid.eq(skid.o.valid), dst.payload.eq(skid.o.payload),
                         skid.o.ready.eq(dst.ready)]
        for i, (up, down) in enumerate(zip(stages[:-1], stages[1:])):
            slice_(f"act_link{i}", up.act_out, down.act_in)
            slice_(f"grad_link{i}", down.grad_out, up.grad_in)
        slice_("act_in_slice", self.act_in, stages[0].act_in)
        slice_("act_out_slice", stages[-1].act_out, self.act_out)
        slice_("grad_in_slice", self.grad_in, stages[-1].grad_in)
        slice_("grad_out_slice", stages[0].grad_out, self.grad_out)
        busy = Signal()
        m.d.comb += busy.eq(sum(st.busy for st in stages) != 0)
        was_busy = Signal()
        m.d.sync += was_busy.eq(busy)
        m.d.comb += [self.busy.eq(busy), self.done.eq(was_busy & ~busy)]
        return m
