"""The pipeline designs the cocotb bench simulates and their Verilog / Verilator builds
(cached by content)."""
from __future__ import annotations

from gnnweave.golden.pipeline import TrainFormat
from .host import BENCH_FORMAT


#: Build parameters of the cocotb pipeline (one Verilator build per stage count).
#: Optional keys: ``max_in`` / ``max_out`` (a wide, short layer), ``versions``.
COCOTB_BUILD = dict(lanes=4, max_dim=8, max_rows=8, slots=16)
PIPELINE_TOP = "gnnweave_pipeline"


def _hw_hash(extra: str) -> str:
    import hashlib
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(extra.encode())
    h.update(b"zero-init-loops")   # all-zero memories written as one loop each
    for f in ("hw/mac.py", "hw/train_stage.py", "hw/sgd_pipeline.py", "hw/arith.py", "hw/pipeline.py",
              "gnnweave/fixed.py"):
        h.update((root / f).read_bytes())
    return h.hexdigest()[:16]


def _stage_kwargs(stages: int, fmt: TrainFormat, cfg: dict) -> dict:
    sgd = fmt.sgd
    kw = dict(lanes=cfg["lanes"], max_dim=cfg["max_dim"], max_rows=cfg["max_rows"],
              slots=cfg["slots"], versions=cfg.get("versions", stages + 2), master=sgd.master,
              weight=sgd.weight, grad_sum=sgd.grad, lr=sgd.lr, wd=sgd.wd, mu=sgd.mu)
    for name in ("max_in", "max_out"):
        if cfg.get(name):
            kw[name] = cfg[name]
    return kw


def cocotb_pipeline(stages: int, fmt: TrainFormat = BENCH_FORMAT, **build):
    """The Pipeline the cocotb bench simulates (``COCOTB_BUILD`` sizes)."""
    from gnnweave.hw.pipeline import Pipeline
    cfg = {**COCOTB_BUILD, **build}
    return Pipeline(stages, **_stage_kwargs(stages, fmt, cfg))


def segment_layout(fmt: TrainFormat = BENCH_FORMAT, stages: int = 1, **build):
    """Stream payload layout of a :func:`cocotb_pipeline` build (no elaboration)."""
    from gnnweave.hw.mac import output_layout
    from gnnweave.hw.train_stage import TrainStage
    cfg = {**COCOTB_BUILD, **build}
    kw = _stage_kwargs(stages, fmt, cfg)
    stage = TrainStage(**kw)
    stage._MustUse__silence = stage.core._MustUse__silence = True   # only its sizes are needed
    return output_layout(kw["lanes"], stage.index_bits, 16)


def split_pipelines(device_stages, fmt: TrainFormat = BENCH_FORMAT, **build):
    """Several :class:`~gnnweave.hw.pipeline.Pipeline` s ("devices") side by side in one
    design, NOT connected to each other: every port of device ``d`` is a top port named
    ``d<d>_<port>``. The bench links the devices' end streams (a model of the links
    between boards), so each device sees only its own slice of the global pipeline."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from gnnweave.hw.pipeline import Pipeline
    cfg = {**COCOTB_BUILD, **build}
    total = sum(device_stages)
    pipes = [Pipeline(k, **_stage_kwargs(total, fmt, cfg)) for k in device_stages]

    class SplitPipelines(wiring.Component):
        def __init__(self):
            self.devices = pipes
            members = {}
            for d, pipe in enumerate(pipes):
                for name, member in pipe.signature.members.items():
                    members[f"d{d}_{name}"] = member
            super().__init__(members)

        def elaborate(self, platform):
            m = Module()
            for d, pipe in enumerate(pipes):
                m.submodules[f"device{d}"] = pipe
                for name, member in pipe.signature.members.items():
                    outer, inner = getattr(self, f"d{d}_{name}"), getattr(pipe, name)
                    if member.is_port:
                        if member.flow == wiring.In:
                            m.d.comb += inner.eq(outer)
                        else:
                            m.d.comb += outer.eq(inner)
                    elif member.flow == wiring.In:   # stream into the device
                        m.d.comb += [inner.valid.eq(outer.valid), inner.payload.eq(outer.payload),
                                     outer.ready.eq(inner.ready)]
                    else:
                        m.d.comb += [outer.valid.eq(inner.valid), outer.payload.eq(inner.payload),
                                     inner.ready.eq(outer.ready)]
            return m

    return SplitPipelines()


_ZERO_INIT_LINE = None


def compact_zero_memory_init(text: str) -> str:
    """Replace Yosys' memory initialisers that write 0 to every word one statement per
    word (``mem[0] = 256'h0; mem[1] = ...``) by one loop per memory, in Verilog text
    already written. The builds here never produce such text (:func:`pipeline_verilog`
    marks the all-zero memories before Yosys sees them); it stays as an independent
    rewrite the marked loops are checked against."""
    import re
    global _ZERO_INIT_LINE
    if _ZERO_INIT_LINE is None:
        _ZERO_INIT_LINE = re.compile(r"^\s+(\\\S+ |[A-Za-z_][\w$]*)\[(\d+)\] = \d+'[hdb]0+;$")
    lines = text.split("\n")
    out, i, loops = [], 0, 0
    while i < len(lines):
        if lines[i].strip() == "initial begin":
            j, name, count = i + 1, None, 0
            while j < len(lines) and lines[j].strip() != "end":
                mm = _ZERO_INIT_LINE.match(lines[j])
                if not mm or (name is not None and mm.group(1) != name) or int(mm.group(2)) != count:
                    break
                name, count, j = mm.group(1), count + 1, j + 1
            if count > 1 and j < len(lines) and lines[j].strip() == "end":
                loops += 1
                v = f"gnnweave_zero{loops}"
                out += [f"  integer {v};", "  initial begin",
                        f"    for ({v} = 0; {v} < {count}; {v} = {v} + 1) {name}[{v}] = 0;", "  end"]
                i = j + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _fmt_key(fmt: TrainFormat) -> str:
    return repr(fmt.sgd)


def pipeline_verilog(stages: int, fmt: TrainFormat = BENCH_FORMAT, devices=None, **build):
    """Write (once per content) the Verilog of :func:`cocotb_pipeline` (or, with
    ``devices=(k0, k1, ...)``, of :func:`split_pipelines`); returns its path."""
    import json as _json
    from amaranth.back import verilog
    from gnnweave.hw.flow.verilog import ZERO_INIT_ATTR, zero_init_loops, zero_memory_init
    from gnnweave.sim import runner
    cfg = {**COCOTB_BUILD, **build}
    key = _hw_hash(_json.dumps([stages, cfg, _fmt_key(fmt), list(devices or [])], sort_keys=True))
    name = f"pipeline{stages}" + (f"-split{'_'.join(map(str, devices))}" if devices else "")
    out = runner.BUILD_ROOT / "verilog" / f"{name}-{key}"
    path = out / f"{PIPELINE_TOP}.v"
    with runner.file_lock(runner.BUILD_ROOT / "verilog" / f".{name}-{key}.lock"):
        if path.is_file():
            return path
        out.mkdir(parents=True, exist_ok=True)
        top = split_pipelines(devices, fmt, **build) if devices else cocotb_pipeline(stages, fmt, **build)
        # all-zero memories as one loop each, as the accelerator's Verilog build writes them
        with zero_memory_init(mark=ZERO_INIT_ATTR):
            text = verilog.convert(top, name=PIPELINE_TOP, emit_src=False)
        text = zero_init_loops(text)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def build_pipeline_sim(stages: int, sim: str = "verilator", fmt: TrainFormat = BENCH_FORMAT,
                       devices=None, **build):
    """Verilator build (cached by content)."""
    from gnnweave.sim import runner
    return runner.build([pipeline_verilog(stages, fmt, devices, **build)], PIPELINE_TOP, sim)
