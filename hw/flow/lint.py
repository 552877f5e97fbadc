"""``make lint``: Verilator's strictest lint on the generated Verilog, with the waivers of
``lint_waivers.vlt`` beside this module (each carries the reason it is waived).

Verilator itself is found by the simulation room (``gnnweave.sim.lint`` passes it in), so
this module needs no simulator to import."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

WAIVERS = Path(__file__).resolve().with_name("lint_waivers.vlt")
#: seconds one Verilator lint run may take
LINT_LIMIT_S = 600


def lint_verilog(path, top: str, *, verilator, waivers: Path | None = WAIVERS) -> dict:
    """Run ``verilator --lint-only -Wall`` (the executable ``verilator``) on ``path`` with
    and without ``waivers``; returns ``{clean, warnings, waived, waived_rules,
    waiver_file, log}``."""
    base = [str(verilator), "--lint-only", "-Wall", "--top-module", top]

    def run(extra):
        proc = subprocess.run(base + extra + [str(path)], capture_output=True, text=True,
                              timeout=LINT_LIMIT_S)
        found = re.findall(r"^%(Warning-[A-Z0-9_]+|Error)", proc.stderr, flags=re.M)
        return proc, [f for f in found if f != "Error"]

    _, raw = run([])
    proc, left = run([str(waivers)] if waivers else [])
    rules = sorted({w.split("-", 1)[1] for w in raw})
    return {"clean": proc.returncode == 0 and not left, "warnings": len(left),
            "waived": len(raw) - len(left), "waived_rules": rules,
            "waiver_file": str(waivers) if waivers else None, "log": proc.stderr[-4000:]}
