"""Cycle-accurate bench of the training Pipeline RTL against golden, by job:

- :mod:`.host`: the bench's host, independent of the simulator (:class:`PipelineHost`:
  drives the end streams and weight ports cycle by cycle, plays the loss gradient,
  records every result), the segment codec and the run summaries;
- :mod:`.amaranth_run`: the bench on the Amaranth simulator (:func:`run_pipeline_rtl`);
- :mod:`.problems`: training problems, their golden runs and running one on the RTL
  (:func:`run_problem_rtl`, :func:`verify_pipeline`, what ``gnnweave verify pipeline`` calls);
- :mod:`.build`: the designs the cocotb bench simulates and their Verilator builds;
- :mod:`.batch`: runs of the cocotb bench from Python, one case or a batch per build;
- :mod:`.cocotb_bench`: the cocotb tests themselves;
- :mod:`.devices`: stages split over several linked devices;
- :mod:`.sgc`: SGC's classifier training on the RTL.
"""
from .amaranth_run import AmaranthIO, build_pipeline, run_pipeline_rtl
from .batch import run_cocotb_pipeline, run_cocotb_pipeline_batch
from .build import (COCOTB_BUILD, PIPELINE_TOP, build_pipeline_sim, cocotb_pipeline,
                    compact_zero_memory_init, pipeline_verilog, segment_layout, split_pipelines)
from .devices import DevicesIO, verify_split_pipeline
from .host import (BENCH_FORMAT, PipelineHost, RtlRun, SegmentCodec, compare_with_golden,
                   measured_bubble, pack_words, streaming_order, summarize, unpack_words)
from .problems import (PipelineProblem, compare_problem, make_problem, problem_build, random_problem,
                       run_problem_rtl, verify_pipeline)
from .sgc import sgc_problem, verify_sgc_rtl

__all__ = [
    "AmaranthIO", "BENCH_FORMAT", "COCOTB_BUILD", "DevicesIO", "PIPELINE_TOP", "PipelineHost",
    "PipelineProblem", "RtlRun", "SegmentCodec", "build_pipeline", "build_pipeline_sim",
    "cocotb_pipeline", "compact_zero_memory_init", "compare_problem", "compare_with_golden",
    "make_problem", "measured_bubble", "pack_words", "pipeline_verilog", "problem_build",
    "random_problem", "run_cocotb_pipeline", "run_cocotb_pipeline_batch", "run_pipeline_rtl",
    "run_problem_rtl", "segment_layout", "sgc_problem", "split_pipelines", "streaming_order",
    "summarize", "unpack_words", "verify_pipeline", "verify_sgc_rtl", "verify_split_pipeline",
]
