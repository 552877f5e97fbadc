"""hw/flow/verilog.py: all-zero memory initialisers become one loop per memory.

The Verilog of a design with an all-zero memory and a non-zero one is compared with the
word-by-word initialisers Yosys writes without the loops (rewritten by the simulation
benches' own compaction, an independent implementation: the texts must be equal), and run
on Icarus, which starts an uninitialised memory at x: every word of the zero memory must
read 0, the non-zero memory its contents.
"""
import shutil
import subprocess

import pytest
from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from gnnweave.hw.flow.verilog import (ZERO_INIT_ATTR, VitisWrapper, to_verilog,
                                      zero_init_loops)
from gnnweave.sim.pipeline_bench import compact_zero_memory_init

ZERO_DEPTH, TABLE = 24, [5, 0, 7, 9]


class _Memories(wiring.Component):
    """A written all-zero memory (``zero``) and a ROM with contents (``contents``)."""
    addr: In(5)
    zero: Out(8)
    contents: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.zeros = zeros = Memory(shape=8, depth=ZERO_DEPTH, init=[])
        m.submodules.rom = rom = Memory(shape=8, depth=len(TABLE), init=TABLE)
        rd, wr, rd_rom = zeros.read_port(), zeros.write_port(), rom.read_port()
        m.d.comb += [rd.addr.eq(self.addr), self.zero.eq(rd.data), wr.addr.eq(self.addr),
                     wr.data.eq(self.addr), wr.en.eq(0),
                     rd_rom.addr.eq(self.addr), self.contents.eq(rd_rom.data)]
        return m


def test_zero_memory_becomes_a_loop_and_contents_stay_word_by_word():
    text = to_verilog(_Memories(), "mems")
    assert ZERO_INIT_ATTR not in text
    assert text.count("initial begin") == 2
    assert f"gnnweave_zero1 < {ZERO_DEPTH};" in text
    assert "rom[0] = 8'h05;" in text and "rom[3] = 8'h09;" in text
    wrapper = VitisWrapper(_Memories())
    words = verilog.convert(wrapper, name="mems", ports=wrapper.ports(), emit_src=False,
                            strip_internal_attrs=True)
    assert words.count("= 8'h00;") >= ZERO_DEPTH
    assert text.split("\n", 1)[1] == compact_zero_memory_init(words)


def test_a_mark_on_something_else_is_a_clear_error():
    bad = f"  (* \\{ZERO_INIT_ATTR}  = 32'd1 *)\n  wire [7:0] x;\n"
    with pytest.raises(RuntimeError, match="not a memory declaration"):
        zero_init_loops(bad)


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog not installed")
def test_zero_memory_reads_zero_on_icarus(tmp_path):
    (tmp_path / "mems.v").write_text(to_verilog(_Memories(), "mems"))
    (tmp_path / "tb.v").write_text(f"""
module tb;
  reg clk = 0; reg rst_n = 0; reg [4:0] addr = 0; wire [7:0] zero, contents;
  integer i;
  integer bad;
  mems dut(.ap_clk(clk), .ap_rst_n(rst_n), .addr(addr), .zero(zero), .contents(contents));
  always #5 clk = ~clk;
  initial begin
    bad = 0;
    for (i = 0; i < {ZERO_DEPTH}; i = i + 1) begin
      addr = i; @(posedge clk); #1;
      if (zero !== 8'd0) bad = bad + 1;
      if (i < {len(TABLE)}) $display("table %0d %0d", i, contents);
    end
    $display("bad %0d", bad);
    $finish;
  end
endmodule
""")
    subprocess.run(["iverilog", "-o", "sim", "mems.v", "tb.v"], cwd=tmp_path, check=True)
    out = subprocess.run(["vvp", "-n", "sim"], cwd=tmp_path, check=True, capture_output=True,
                         text=True).stdout
    assert "bad 0" in out
    for i, v in enumerate(TABLE):
        assert f"table {i} {v}" in out
