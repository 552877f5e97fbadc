"""``make lint``: Verilator's strictest lint on the generated Verilog, with the waivers of
``hw/lint_waivers.vlt`` (each carries the reason it is waived)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import toolchain

WAIVERS = Path(__file__).resolve().parents[1] / "hw" / "lint_waivers.vlt"


def lint_verilog(path, top: str, *, waivers: Path | None = WAIVERS) -> dict:
    """Run ``verilator --lint-only -Wall``; returns {clean, warnings, waived, log}."""
    tool = toolchain.setup_verilator()
    base = [str(tool.executable), "--lint-only", "-Wall", "--top-module", top]
    def run(extra):
        proc = subprocess.run(base + extra + [str(path)], capture_output=True, text=True,
                              timeout=600)
        found = re.findall(r"^%(Warning-[A-Z0-9_]+|Error)", proc.stderr, flags=re.M)
        return proc, [f for f in found if f != "Error"]
    raw_proc, raw = run([])
    proc, left = run([str(waivers)] if waivers else [])
    rules = sorted({w.split("-", 1)[1] for w in raw})
    return {"clean": proc.returncode == 0 and not left, "warnings": len(left),
            "waived": len(raw) - len(left), "waived_rules": rules,
            "waiver_file": str(waivers) if waivers else None, "log": proc.stderr[-4000:]}
