"""Device names -> executors: :func:`make_executor`, :func:`available_devices`."""
from __future__ import annotations

import os

from gnnweave.host.executors.base import DeviceUnavailable, Executor
from gnnweave.host.executors.cpu import CpuExecutor
from gnnweave.host.executors.fpga_emu import FpgaEmuExecutor
from gnnweave.host.executors.gpu import GpuExecutor, cuda_count


def _driver():
    try:
        from gnnweave.host import driver
    except ImportError:
        return None
    return driver


def _open_accelerator(kind: str, name: str, **kw) -> Executor:
    if _driver() is None:
        what = "the simulated device" if kind == "fpga-sim" else "a PYNQ board"
        raise DeviceUnavailable(
            f"no {kind} device: {what} needs gnnweave.host.driver, which is not in this build; "
            f"available: {', '.join(available_devices())}")
    from gnnweave.host.executors.fpga import open_executor
    try:
        return open_executor(kind, name=name, **kw)
    except DeviceUnavailable:
        raise
    except (ImportError, OSError, RuntimeError) as exc:
        raise DeviceUnavailable(f"no {kind} device: {exc}") from None


def available_devices() -> list[str]:
    """Device names that :func:`make_executor` can construct on this machine."""
    names = ["cpu"]
    names += [f"gpu:{i}" for i in range(cuda_count())]
    names.append("fpga-emu")
    driver = _driver()
    probe = getattr(driver, "available_kinds", None) if driver is not None else None
    if probe is not None:
        try:
            kinds = list(probe())
        except Exception:  # a probe that fails means no such device
            kinds = []
        names += [k for k in ("fpga-sim", "fpga") if k in kinds]
    return names


def split_name(name: str) -> tuple[str, str | None]:
    """``'gpu:1'`` -> ``('gpu', '1')``, ``'cpu'`` -> ``('cpu', None)``."""
    base, sep, suffix = name.partition(":")
    return base, (suffix if sep else None)


def make_executor(name: str, **kw) -> Executor:
    """Executor for a device name: 'cpu', 'gpu', 'gpu:<i>', 'fpga-emu', 'fpga-sim', 'fpga'.

    ``cpu:<tag>`` and ``fpga-emu:<tag>`` make further independent instances (so one
    machine can stand in for several devices of a partition).
    """
    if not isinstance(name, str) or not name:
        raise DeviceUnavailable(f"device name must be a non-empty string, got {name!r}")
    base, suffix = split_name(name.strip().lower())
    if base == "cpu":
        return CpuExecutor(name, **kw)
    if base == "fpga-emu":
        return FpgaEmuExecutor(name, **kw)
    if base in ("gpu", "cuda"):
        try:
            index = int(suffix) if suffix is not None else 0
        except ValueError:
            raise DeviceUnavailable(f"gpu index must be an integer, got {name!r}") from None
        return GpuExecutor(index, **kw)
    if base in ("fpga-sim", "fpga"):
        return _open_accelerator(base, name, **kw)
    raise DeviceUnavailable(f"unknown device {name!r}: available: {', '.join(available_devices())}")


def default_device() -> str:
    """``$GNNWEAVE_DEVICE`` or 'cpu'."""
    return os.environ.get("GNNWEAVE_DEVICE", "cpu")
