"""Progress for steps that take more than a few seconds but have no natural count.

``with stage("Verilator build of gnnweave_top"):`` shows the stage's name and its elapsed
time on stderr while the work runs (a tqdm line refreshed twice a second on a terminal;
one line at the start and one at the end otherwise, so CI logs stay short), then
``... done in 84 s``. ``GNNWEAVE_PROGRESS=0`` silences it.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager


def _enabled() -> bool:
    return os.environ.get("GNNWEAVE_PROGRESS", "1") != "0"


@contextmanager
def stage(name: str, *, note: str = ""):
    """Show ``name`` (and ``note``, e.g. "first time: minutes") while the block runs."""
    if not _enabled():
        yield
        return
    start = time.perf_counter()
    interactive = sys.stderr.isatty()
    label = f"{name}{f' ({note})' if note else ''}"
    stop = threading.Event()
    bar = None
    if interactive:
        from tqdm.auto import tqdm
        bar = tqdm(total=None, desc=label, bar_format="{desc}: {elapsed}", leave=False,
                   file=sys.stderr)

        def tick():
            while not stop.wait(0.5):
                bar.refresh()
        threading.Thread(target=tick, daemon=True).start()
    else:
        print(f"{label} ...", file=sys.stderr, flush=True)
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - start
        print(f"{name}: {'done' if ok else 'stopped'} in {seconds:.0f} s", file=sys.stderr,
              flush=True)
