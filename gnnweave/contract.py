"""The host/hardware contract: what the RTL, the driver, the benches and the simulated device
agree on, written once.

* the IP: its VLNV, module name and block-design instance name;
* the Vitis ``ap_ctrl_hs`` block at 0x00-0x0F (CTRL, GIE, IER, ISR): offsets and bits;
* the unit ids (values of the ``unit`` register) and the registers every build has at fixed
  offsets (``unit`` at 0x10, ``units_present`` at 0x14);
* each unit's register declarations ``(name, width, doc)`` (their order fixes the offsets
  :class:`gnnweave.hw.regmap.RegisterBuilder` allocates) and its ``status`` bits;
* the IP parameters a ``.hwh`` carries (the build's limits the driver checks before a run)
  and the limits every build shares (operand widths, shift ranges, counts).

Pure Python (no Amaranth): the hardware builds from it, a host on a board imports it.
Offsets other than the fixed ones are build dependent: hosts read them from the exported
register map (JSON, C header or the ``.hwh``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields

__all__ = [
    "ACCELERATOR_TOP", "VLNV", "INSTANCE_NAME",
    "DATA_WIDTH", "WORD_BYTES", "CTRL_OFFSET", "GIE_OFFSET", "IER_OFFSET", "ISR_OFFSET",
    "FIRST_REGISTER_OFFSET", "CtrlBit", "GieBit", "IrqBit",
    "Unit", "UNIT_REGISTER", "UNITS_PRESENT_REGISTER", "STATUS_REGISTER",
    "AggregatorStatus", "MacArrayStatus", "PipelineStatus", "UNIT_STATUS", "RUN_FAILED",
    "AGGREGATOR_CONFIG_REGISTERS", "AGGREGATOR_STATUS_REGISTERS",
    "MAC_ARRAY_CONFIG_REGISTERS", "MAC_ARRAY_STATUS_REGISTERS",
    "PIPELINE_STAGE_REGISTERS", "PIPELINE_STAGE_COUNTERS", "PIPELINE_BUFFERS",
    "pipeline_config_registers", "pipeline_status_registers", "PipeMode",
    "IpParameters", "Limits", "split_words", "join_words",
]

# ----------------------------------------------------------------------------- the IP
#: Module name of the generated top (and the IP's name in the VLNV).
ACCELERATOR_TOP = "gnnweave"
#: The IP's VLNV: the bitstream flow packages the IP under it, the ``.hwh`` names it, the
#: PYNQ driver binds to it.
VLNV = f"gnnweave:hls:{ACCELERATOR_TOP}:1.0"
#: Its instance name in the block design (``Overlay("gnnweave.bit").gnnweave_0``).
INSTANCE_NAME = f"{ACCELERATOR_TOP}_0"

# ----------------------------------------------------------------------------- ap_ctrl_hs
#: AXI4-Lite data width: 32 bits (the Vitis/PYNQ convention); wider registers take two words.
DATA_WIDTH = 32
WORD_BYTES = DATA_WIDTH // 8

CTRL_OFFSET = 0x00
GIE_OFFSET = 0x04
IER_OFFSET = 0x08
ISR_OFFSET = 0x0C
FIRST_REGISTER_OFFSET = 0x10


class _Bit(enum.IntEnum):
    @property
    def mask(self) -> int:
        """The bit as a mask (``1 << position``)."""
        return 1 << self.value


class CtrlBit(_Bit):
    """Bit positions in CTRL (0x00): ``ap_start`` (RW; cleared by the hardware when it
    accepts the start unless ``auto_restart``), ``ap_done`` (clear on read), ``ap_idle``
    (RO), ``ap_ready`` (clear on read), ``auto_restart`` (RW)."""
    AP_START = 0
    AP_DONE = 1
    AP_IDLE = 2
    AP_READY = 3
    AUTO_RESTART = 7


class GieBit(_Bit):
    """Bit positions in GIE (0x04)."""
    ENABLE = 0


class IrqBit(_Bit):
    """Bit positions in IER (0x08) and ISR (0x0C): an enabled event sets its ISR bit,
    writing 1 toggles it; ``interrupt = GIE & |ISR``."""
    AP_DONE = 0
    AP_READY = 1


# ----------------------------------------------------------------------------- units
class Unit(enum.IntEnum):
    """Value of the ``unit`` register (which unit ``ap_start`` runs); bit ``u`` of
    ``units_present`` says unit ``u`` is in the build."""
    AGGREGATOR = 0
    MAC_ARRAY = 1
    PIPELINE = 2


#: The two registers every build has, at fixed offsets, before any unit's.
UNIT_REGISTER = ("unit", 8, "Unit that ap_start runs: " +
                 ", ".join(f"{u.value} {u.name.lower()}" for u in Unit))
UNITS_PRESENT_REGISTER = ("units_present", 8,
                          "Bit u set: unit u is in this build (see the unit register)")
UNIT_OFFSET = FIRST_REGISTER_OFFSET
UNITS_PRESENT_OFFSET = FIRST_REGISTER_OFFSET + WORD_BYTES
#: Name of every unit's status register.
STATUS_REGISTER = "status"


class AggregatorStatus(enum.IntFlag):
    """Bits of the Aggregator's ``status`` register (sticky for one run, cleared at start)."""
    CONFIG_ERROR = 1 << 0    # run refused before any memory traffic
    INDEX_REJECTED = 1 << 1  # an index >= num_nodes was skipped
    BAD_INDPTR = 1 << 2      # row pointers were clamped
    ADDR_FAULT = 1 << 3      # a burst outside its buffer was refused (run aborted)
    AXI_ERROR = 1 << 4       # SLVERR/DECERR on R or B


class MacArrayStatus(enum.IntFlag):
    """Bits of the MacArray's ``status`` register (cleared at start); positions as the
    Aggregator's."""
    CONFIG_ERROR = 1 << 0
    ADDR_FAULT = 1 << 3
    AXI_ERROR = 1 << 4


class PipelineStatus(enum.IntFlag):
    """Bits of the training Pipeline's ``status`` register (cleared at start); positions
    as the Aggregator's."""
    CONFIG_ERROR = 1 << 0
    ADDR_FAULT = 1 << 3
    AXI_ERROR = 1 << 4


UNIT_STATUS = {Unit.AGGREGATOR: AggregatorStatus, Unit.MAC_ARRAY: MacArrayStatus,
               Unit.PIPELINE: PipelineStatus}
#: Status bits (the same positions in every unit) that mean the run was refused or aborted:
#: its outputs are not valid. A start of a unit that is not in the build ends with
#: CONFIG_ERROR alone.
RUN_FAILED = ("config_error", "addr_fault", "axi_error")


def status_register(flags) -> tuple:
    """The ``status`` declaration ``(name, width, doc)`` of a unit whose status bits are the
    ``enum.IntFlag`` ``flags`` (the doc lists each bit)."""
    return (STATUS_REGISTER, 32, "Status bits of the last run: " + ", ".join(
        f"bit{s.bit_length() - 1} {s.name.lower()}" for s in flags))


#: Counter declarations every unit on the AXI front end drives the same way.
BUSY_CYCLES = ("busy_cycles", 64, "Cycles from start to done")
BUS_COUNTERS = (
    ("read_beats", 64, "R beats accepted"),
    ("write_beats", 64, "W beats sent"),
    ("stall_cycles", 64, "Cycles a manager channel (AR, AW, W) waited for ready"),
)

# -- the Aggregator
#: Registers the host writes (name, width, doc); order fixes the offsets.
AGGREGATOR_CONFIG_REGISTERS = (
    ("num_nodes", 32, "Number of destination nodes N (rows of the CSR and of the output)"),
    ("num_edges", 32, "Number of entries E of the index (and weight) stream"),
    ("feat_dim", 32, "Feature elements per row F (1 .. max_feat_dim)"),
    ("reduce_op", 32, "0 sum, 1 mean, 2 max"),
    ("use_weights", 32, "1: multiply by per-edge weights; 0: unweighted"),
    ("shift", 32, "Narrowing shift: feat.frac + weight.frac - out.frac (0 .. 63)"),
    ("feat_stride", 32, "Bytes between feature rows (multiple of the bus width)"),
    ("out_stride", 32, "Bytes between output rows (multiple of the bus width)"),
    ("indptr_addr", 64, "Base of indptr: N+1 little-endian uint32"),
    ("indptr_size", 64, "Bytes of the indptr buffer"),
    ("indices_addr", 64, "Base of indices: E uint32 source node ids"),
    ("indices_size", 64, "Bytes of the indices buffer"),
    ("weights_addr", 64, "Base of weights: E int16"),
    ("weights_size", 64, "Bytes of the weights buffer"),
    ("feat_addr", 64, "Base of the feature rows"),
    ("feat_size", 64, "Bytes of the feature buffer"),
    ("out_addr", 64, "Base of the output rows"),
    ("out_size", 64, "Bytes of the output buffer"),
)
#: Registers the hardware drives.
AGGREGATOR_STATUS_REGISTERS = (
    status_register(AggregatorStatus),
    BUSY_CYCLES,
    *BUS_COUNTERS,
    ("mem_wait_cycles", 64, "Busy cycles with reads outstanding and no R beat"),
    ("edges", 64, "Edges gathered (valid indices)"),
    ("rejected_indices", 64, "Indices >= num_nodes skipped"),
    ("saturations", 64, "Output elements that saturated"),
)

# -- the MacArray
MAC_ARRAY_CONFIG_REGISTERS = (
    ("mode", 32, "0 fwd (Y = X W + b), 1 dx (dX = dY W^T), 2 dw (dW = X^T dY)"),
    ("m", 32, "Output rows (1 .. 2**32-1)"),
    ("n", 32, "Output columns (1 .. 2**32-1)"),
    ("k", 32, "Depth: the contracted dimension (1 .. 2**32-1; cut into max_depth blocks)"),
    ("shift", 32, "Narrowing shift frac(P) + frac(Q) - frac(out) (0 .. 63)"),
    ("relu", 32, "1: fused ReLU on the output (fwd only)"),
    ("use_bias", 32, "1: add bias << bias_shift before narrowing (fwd only)"),
    ("bias_shift", 32, "Left shift aligning the bias into the product fraction (0 .. 31)"),
    ("p_addr", 64, "Base of P (fwd X [m,k], dx dY [m,k], dw X [k,m]); int16 rows"),
    ("p_size", 64, "Bytes of the P buffer"),
    ("p_stride", 64, "Bytes between P rows (multiple of the bus width)"),
    ("q_addr", 64, "Base of Q (fwd W [k,n], dx W [n,k], dw dY [k,n]); int16 rows"),
    ("q_size", 64, "Bytes of the Q buffer"),
    ("q_stride", 64, "Bytes between Q rows (multiple of the bus width)"),
    ("bias_addr", 64, "Base of the bias: n int32"),
    ("bias_size", 64, "Bytes of the bias buffer"),
    ("out_addr", 64, "Base of the output [m,n]; int16 rows"),
    ("out_size", 64, "Bytes of the output buffer"),
    ("out_stride", 64, "Bytes between output rows (multiple of the bus width)"),
)
MAC_ARRAY_STATUS_REGISTERS = (
    status_register(MacArrayStatus),
    BUSY_CYCLES,
    ("mac_active_cycles", 64, "Cycles the array accumulated"),
    ("mac_ops", 64, "Useful multiply-accumulates (m * n * k for a complete run)"),
    ("stall_cycles", 64, "Cycles the array was frozen by its drain or by write back-pressure"),
    ("load_cycles", 64, "Busy cycles the array waited for operands (block loads, bias)"),
    ("read_beats", 64, "R beats accepted"),
    ("write_beats", 64, "W beats sent"),
    ("saturations", 64, "Output elements that saturated"),
)

# -- the training Pipeline


class PipeMode(enum.IntEnum):
    """Value of the Pipeline's ``pipe_mode`` register."""
    LOAD_WEIGHTS = 0
    STORE_WEIGHTS = 1
    TRAIN = 2


#: Per-stage configuration registers ``s<i>_<name>`` (32 bits each).
PIPELINE_STAGE_REGISTERS = (
    ("d_in", "Input features of the stage (1 .. max_in; equals the previous stage's d_out)"),
    ("d_out", "Output features of the stage (1 .. max_out)"),
    ("relu", "1: ReLU after the stage's forward (its mask gates the backward)"),
    ("fwd_shift", "Narrowing shift of the forward Y = X W (0 .. 63)"),
    ("dx_shift", "Narrowing shift of dX = dY W^T (0 .. 63)"),
    ("dw_shift", "Narrowing shift of dW = X^T dY (0 .. 63)"),
    ("lr", "SGD learning rate, raw (SgdFormat.lr, 16 bits)"),
    ("wd", "SGD weight decay, raw (SgdFormat.wd, 16 bits)"),
    ("mu", "SGD momentum, raw (SgdFormat.mu, 16 bits; 0: plain SGD)"),
    ("dx_first", "1: dX leaves before dW is computed (the default order; 0: textbook order)"),
)
#: Per-stage counters ``s<i>_<name>`` (``mac_ops`` 64 bits, the others 32).
PIPELINE_STAGE_COUNTERS = (
    ("busy_cycles", "Cycles the stage was running"),
    ("fwd_cycles", "Cycles in forwards"),
    ("bwd_cycles", "Cycles in backwards (dX and dW)"),
    ("upd_cycles", "Cycles in SGD updates"),
    ("wait_cycles", "Cycles the stage waited for an input or a gradient"),
    ("mac_ops", "Multiply-accumulates"),
    ("saturations", "Saturated outputs and updates"),
    ("ops_done", "F, B and U ops completed"),
)
#: The Pipeline's buffers: ``<name>_addr``, ``<name>_size``, ``<name>_stride`` each.
PIPELINE_BUFFERS = (
    ("act", "TRAIN inputs: [N*rows, s0_d_in] int16"),
    ("logits", "TRAIN logits (written): [N*rows, d_out of the last stage] int16"),
    ("grad", "TRAIN loss gradient (host-written): [N*rows, d_out of the last stage] int16"),
    ("dx", "TRAIN stage 0 input gradient (written; addr 0: not written): [N*rows, s0_d_in] int16"),
    ("w", "LOAD/STORE_WEIGHTS master weights of one stage: [d_in, d_out] int32"),
)


def pipeline_config_registers(stages: int) -> tuple:
    """Registers the host writes (name, width, doc) of a ``stages``-stage Pipeline."""
    regs = [
        ("pipe_mode", 32, "0 load_weights, 1 store_weights, 2 train"),
        ("stage", 32, "Stage whose master weights load_weights/store_weights move"),
        ("schedule", 32, "0 GPipe, 1 1F1B-flush, 2 async 1F1B (weight stashing)"),
        ("microbatches", 32, "Microbatches per step (1 .. 255)"),
        ("steps", 32, "Steps of a TRAIN run (1 .. 65535); N = steps * microbatches"),
        ("rows", 32, "Rows of every microbatch (1 .. max_rows)"),
    ]
    for buf, doc in PIPELINE_BUFFERS:
        regs += [(f"{buf}_addr", 64, f"Base of {doc}"), (f"{buf}_size", 64, f"Bytes of the {buf} buffer"),
                 (f"{buf}_stride", 64, f"Bytes between {buf} rows (multiple of the bus width)")]
    regs.append(("grads_ready", 32, "Doorbell: microbatches whose loss gradient is in memory "
                                    "(written while TRAIN runs; read live)"))
    for i in range(stages):
        regs += [(f"s{i}_{name}", 32, f"Stage {i}: {doc}") for name, doc in PIPELINE_STAGE_REGISTERS]
    return tuple(regs)


def pipeline_status_registers(stages: int) -> tuple:
    """Registers the hardware drives of a ``stages``-stage Pipeline."""
    regs = [
        status_register(PipelineStatus),
        BUSY_CYCLES,
        *BUS_COUNTERS,
        ("logits_done", 32, "TRAIN: microbatches whose logits are in memory (write responses in)"),
        ("grad_wait_cycles", 64, "TRAIN: cycles the gradient reader waited for grads_ready"),
    ]
    for i in range(stages):
        regs += [(f"s{i}_{name}", 64 if name == "mac_ops" else 32, f"Stage {i}: {doc}")
                 for name, doc in PIPELINE_STAGE_COUNTERS]
    return tuple(regs)


def names(declarations) -> tuple[str, ...]:
    """The register names of ``(name, width, doc)`` declarations."""
    return tuple(d[0] for d in declarations)


# ----------------------------------------------------------------------------- limits
class Limits:
    """What every build takes (the register widths and the units' checks); a build's own
    limits are its :class:`IpParameters`."""

    #: Feature, weight and MAC operand elements: int16.
    ELEMENT_MIN, ELEMENT_MAX = -(1 << 15), (1 << 15) - 1
    #: Bias values and Pipeline master weights: int32.
    WIDE_MIN, WIDE_MAX = -(1 << 31), (1 << 31) - 1
    #: Node ids, row pointers, sizes m / n / k: uint32.
    INDEX_MAX = (1 << 32) - 1
    #: Narrowing shifts (``shift``, the Pipeline's per-stage shifts).
    SHIFT_MAX = 63
    #: The MacArray's ``bias_shift``.
    BIAS_SHIFT_MAX = 31
    #: The Pipeline's ``microbatches`` and ``steps`` of one TRAIN run.
    MICROBATCHES_MAX = 255
    STEPS_MAX = 65535
    #: Stages a Pipeline build can have.
    STAGES_MAX = 8


@dataclass(frozen=True)
class IpParameters:
    """A build's limits as the IP's parameters carry them into the ``.hwh`` (``C_<NAME>``;
    :attr:`HWH_NAMES`): what the driver checks before it touches the device. A Pipeline
    limit of 0 means the build has no Pipeline (or the limit is unknown: the hardware's
    own check answers with config_error)."""

    gmem_data_width: int = 128
    max_feat_dim: int = 64
    mac_max_depth: int = 0
    pipe_max_in: int = 0
    pipe_max_out: int = 0
    pipe_max_rows: int = 0
    pipe_slots: int = 0

    #: ``.hwh`` parameter name of each field.
    HWH_NAMES = {"gmem_data_width": "C_M_AXI_GMEM_DATA_WIDTH", "max_feat_dim": "C_MAX_FEAT_DIM",
                 "mac_max_depth": "C_MAC_MAX_DEPTH", "pipe_max_in": "C_PIPE_MAX_IN",
                 "pipe_max_out": "C_PIPE_MAX_OUT", "pipe_max_rows": "C_PIPE_MAX_ROWS",
                 "pipe_slots": "C_PIPE_SLOTS"}
    #: The Pipeline limits, by the name of the Pipeline configuration's field.
    PIPELINE_LIMITS = ("max_in", "max_out", "max_rows", "slots")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"IpParameters.{f.name}: must be a non-negative integer, "
                                 f"not {value!r}")

    @property
    def bus_bytes(self) -> int:
        """Bytes per beat of the memory port."""
        return self.gmem_data_width // 8

    @property
    def pipeline_limits(self) -> dict:
        """``{max_in, max_out, max_rows, slots}`` of the Pipeline (0: none or unknown)."""
        return {k: getattr(self, f"pipe_{k}") for k in self.PIPELINE_LIMITS}

    def hwh_items(self) -> list[tuple[str, int]]:
        """``[(C_NAME, value)]`` in field order, as the ``.hwh`` and the IP packager write them."""
        return [(self.HWH_NAMES[f.name], getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_hwh(cls, parameters: dict) -> "IpParameters":
        """From a ``.hwh`` module's parameters (``{C_NAME: value}``, values as text); one
        that is absent keeps its default, one that is not an integer is an error."""
        values = {}
        for name, hwh in cls.HWH_NAMES.items():
            if parameters.get(hwh) is None:
                continue
            try:
                values[name] = int(str(parameters[hwh]), 0)
            except ValueError:
                raise ValueError(f".hwh parameter {hwh} = {parameters[hwh]!r}: "
                                 f"not an integer") from None
        return cls(**values)


# ----------------------------------------------------------------------------- wide registers
def split_words(value: int, width: int) -> list[int]:
    """The 32-bit words of a ``width``-bit register value, low word first (the order a host
    writes them: the low word at the register's offset, the next at offset + 4)."""
    value = int(value)
    if value < 0 or value >> width:
        raise ValueError(f"value {value} does not fit {width} unsigned bits")
    return [(value >> (DATA_WIDTH * i)) & ((1 << DATA_WIDTH) - 1)
            for i in range(max(1, -(-width // DATA_WIDTH)))]


def join_words(words) -> int:
    """A register value from its 32-bit words, low word first (read in that order: the low
    word's read snapshots the high word of a read-only 64-bit register)."""
    return sum(int(w) << (DATA_WIDTH * i) for i, w in enumerate(words))
