"""Run PipeDream's own optimizer (``optimizer/optimizer_graph_hierarchical.py`` from
msr-fiddle/pipedream, MIT License) on a profile and return its slowest stage and wall time.

PipeDream is not a dependency: point ``$PIPEDREAM_DIR`` at a checkout of its repository
(the folder holding ``optimizer/`` and ``graph/``). Its module reads its options from
module globals set by its ``__main__``; :func:`run_pipedream` sets the same globals and
calls its ``main`` in this process, with its printing discarded. ``graphviz`` (imported by
PipeDream's graph module, used only to draw) is replaced by an empty module if missing.

Run: ``python -m benchmarks.pipedream_reference PROFILE... [--machines N...] [--straight]
[--comm none|overlap] [--bandwidth-gbps B]``; with ``--record FILE`` every mode of every
profile x machine count is run (each in its own process, with a timeout) and added to FILE.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import time
import types
from pathlib import Path


def pipedream_dir() -> Path | None:
    """``$PIPEDREAM_DIR`` if it holds PipeDream's optimizer, else None."""
    env = os.environ.get("PIPEDREAM_DIR")
    if not env:
        return None
    root = Path(env)
    return root if (root / "optimizer" / "optimizer_graph_hierarchical.py").is_file() else None


def _optimizer_module(root: Path):
    if "graphviz" not in sys.modules:
        try:
            importlib.import_module("graphviz")
        except ImportError:
            sys.modules["graphviz"] = types.ModuleType("graphviz")
    for p in (str(root), str(root / "optimizer")):
        if p not in sys.path:
            sys.path.insert(0, p)
    return importlib.import_module("optimizer_graph_hierarchical")


def run_pipedream(profile: str | os.PathLike, machines: int, *, straight: bool,
                  comm: str = "none", bandwidth: float = 10e9, root: Path | None = None) -> dict:
    """PipeDream's slowest stage (seconds per minibatch) and its planning wall and CPU time.

    ``comm="none"`` is PipeDream's default (no ``--activation_compression_ratio``);
    ``comm="overlap"`` passes ``--activation_compression_ratio 1``. Memory limits off and
    every machine used (PipeDream's defaults).
    """
    root = root or pipedream_dir()
    if root is None:
        raise FileNotFoundError("PipeDream not found: set PIPEDREAM_DIR to a checkout of "
                                "msr-fiddle/pipedream")
    mod = _optimizer_module(root)
    mod.straight_pipeline = straight
    mod.use_memory_constraint = False
    mod.use_fewer_machines = False
    mod.memory_size = 16e9
    mod.activation_compression_ratio = 1.0 if comm == "overlap" else None
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        pipeline_s, _ = mod.main([machines], str(profile), [bandwidth], 16e9, straight, False,
                                 False, mod.activation_compression_ratio, None,
                                 print_configuration=False, verbose=False)
    return {"bottleneck_s": pipeline_s, "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0}


MODES = [("straight", "none"), ("straight", "overlap"), ("replicated", "none"),
         ("replicated", "overlap")]

# profiles PipeDream's optimizer is not run on, and what is compared instead
_BRANCHY = ("PipeDream's optimizer does not plan it: its README says it 'won't work for "
            "Inception (or networks with a lot of branching like NASNets)' without first "
            "compressing the graph's branches (compress_graph_branches.py, which changes the "
            "profile), and its antichain DAG has more than 30000 states. gnnweave plans it on "
            "the cuts of one topological order (cuts=auto); compared instead: the exhaustive "
            "search on random DAGs and the chain planner (tests/host/test_planner_dag.py)")
NOT_RECORDED = {"inception_v3": _BRANCHY, "nasnetalarge": _BRANCHY, "nasnetamobile": _BRANCHY}


def _one_in_subprocess(profile: str, machines: int, mode: str, comm: str, bandwidth: float,
                       timeout_s: float) -> dict:
    """One PipeDream run in a child process, killed after ``timeout_s``."""
    import json
    import subprocess

    code = ("import json, sys; from benchmarks.pipedream_reference import run_pipedream; "
            f"print(json.dumps(run_pipedream({profile!r}, {machines}, straight={mode == 'straight'}, "
            f"comm={comm!r}, bandwidth={bandwidth!r})))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout_s, cwd=Path(__file__).resolve().parent.parent)
    except subprocess.TimeoutExpired:
        return {"bottleneck_s": None, "seconds": None, "error": f"did not finish in {timeout_s:g} s"}
    if out.returncode != 0:
        return {"bottleneck_s": None, "seconds": None,
                "error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def record(path: Path, profiles: list[str], machines=(2, 4, 8, 16), bandwidth: float = 10e9,
           timeout_s: float = 300.0) -> dict:
    """Run PipeDream on ``profiles`` x ``machines`` x :data:`MODES` and add the results to the
    JSON file at ``path`` (kept across calls: existing entries are not rerun)."""
    import json
    import platform
    import subprocess

    from gnnweave.host.profiles import resolve_profile

    root = pipedream_dir()
    if root is None:
        raise FileNotFoundError("set PIPEDREAM_DIR to a checkout of msr-fiddle/pipedream")
    data = json.loads(path.read_text()) if path.is_file() else {}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or None
    except OSError:
        commit = None
    data["produced_by"] = {
        "optimizer": "msr-fiddle/pipedream optimizer/optimizer_graph_hierarchical.py",
        "commit": commit or data.get("produced_by", {}).get("commit"),
        "command": "python optimizer_graph_hierarchical.py -f PROFILE/graph.txt -n MACHINES "
                   "-b BANDWIDTH [--straight_pipeline] [--activation_compression_ratio 1]",
        "bandwidth_bytes_per_s": bandwidth, "memory_constraint": False, "use_fewer_machines": False,
        "seconds": "wall time of its main() in one process on "
                   f"{platform.machine()} ({os.cpu_count()} CPUs shared), Python {platform.python_version()}",
        "recorded_with": "python -m benchmarks.pipedream_reference --record FILE PROFILES",
    }
    data["not_recorded"] = NOT_RECORDED
    runs = data.setdefault("runs", {})
    for prof in profiles:
        for n in machines:
            for mode, comm in MODES:
                key = f"{prof}/{n}/{mode}/{comm}"
                if key in runs and runs[key].get("bottleneck_s") is not None:
                    continue
                runs[key] = _one_in_subprocess(str(resolve_profile(prof)), n, mode, comm,
                                               bandwidth, timeout_s)
                print(key, runs[key], flush=True)
                path.write_text(json.dumps(data, indent=1, sort_keys=True))
    return data


if __name__ == "__main__":
    import argparse

    from gnnweave.host.profiles import resolve_profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="+")
    ap.add_argument("--machines", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--straight", action="store_true")
    ap.add_argument("--comm", choices=("none", "overlap"), default="none")
    ap.add_argument("--bandwidth-gbps", type=float, default=10.0, help="GB/s (1e9 bytes/s)")
    ap.add_argument("--record", type=Path, default=None,
                    help="JSON file to add every mode's results to (profiles x machines)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per run, with --record")
    a = ap.parse_args()
    if a.record:
        record(a.record, a.profile, tuple(a.machines), a.bandwidth_gbps * 1e9, a.timeout_s)
    else:
        for prof in a.profile:
            for n in a.machines:
                print(prof, n, run_pipedream(resolve_profile(prof), n, straight=a.straight,
                                             comm=a.comm, bandwidth=a.bandwidth_gbps * 1e9))
