"""The step timeline names each operation and draws each device on its own clock."""
import pytest

from gnnweave.host.timeline import OpRecord, op_label, plot_timeline


def rec(device, kind, op, start, end, device_seconds=None, cpu_seconds=None, transpose=0):
    return OpRecord(device=device, kind=kind, op=op, start=start, end=end,
                    wall_seconds=end - start, device_seconds=device_seconds, bytes_in=0,
                    bytes_out=0, epoch=0, sizes={"transpose": transpose} if op == "aggregate" else {},
                    cpu_seconds=cpu_seconds)


@pytest.mark.parametrize("op, transpose, label", [
    ("aggregate", 0, "aggregate fwd"), ("aggregate", 1, "aggregate bwd"),
    ("dense_forward", 0, "transform fwd"), ("dense_weight_grad", 0, "transform bwd (dW)"),
    ("transfer_in", 0, "copy in"), ("sample", 0, "sampling")])
def test_op_labels(op, transpose, label):
    assert op_label(rec("cpu", "cpu", op, 0, 1, transpose=transpose))[0] == label


def test_fpga_blocks_last_their_device_time_not_the_emulators(tmp_path, monkeypatch):
    import matplotlib.axes
    drawn = []
    real = matplotlib.axes.Axes.broken_barh

    def spy(self, xranges, yrange, **kw):
        drawn.append((list(xranges), yrange))
        return real(self, xranges, yrange, **kw)
    monkeypatch.setattr(matplotlib.axes.Axes, "broken_barh", spy)
    records = [rec("fpga-emu", "fpga-emu", "aggregate", 1.000, 1.050, device_seconds=0.002),
               rec("cpu", "cpu", "dense_forward", 1.060, 1.070, cpu_seconds=0.008)]
    path = plot_timeline(records, tmp_path / "t.png")
    assert path.stat().st_size > 0
    (fpga_x, fpga_w), = drawn[0][0]
    (cpu_x, cpu_w), = drawn[1][0]
    assert fpga_x == pytest.approx(0.0) and fpga_w == pytest.approx(2.0)     # ms, device clock
    assert cpu_x == pytest.approx(60.0) and cpu_w == pytest.approx(8.0)      # ms, CPU time
