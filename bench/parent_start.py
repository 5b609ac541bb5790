"""How long `operatorx run` takes from its interpreter's start to spawning its first worker: the part
of the parent's start that the workers' own start does not overlap (issues 11 and 15).

    python bench/parent_start.py [--repeats 5] [--device cpu]

Each repeat runs `python -m operatorx run` on a 2-case testlist in a fresh process. A sitecustomize
module (written to a temporary directory put first on PYTHONPATH) notes the time at interpreter start
and prints the seconds elapsed when `subprocess.Popen` starts `operatorx.run.worker`. Also times
`python -m operatorx --help` (the CLI's import alone).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PROBE = '''
import os, sys, time
_T0 = time.time()
import subprocess
_orig = subprocess.Popen.__init__
def _init(self, args, *a, **k):
    if "operatorx.run.worker" in " ".join(map(str, args if isinstance(args, (list, tuple)) else [args])):
        sys.stderr.write(f"OX_SPAWN_AFTER_S {time.time() - _T0:.4f}\\n")
    _orig(self, args, *a, **k)
subprocess.Popen.__init__ = _init
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from operatorx.spec import load_testlist, resolve_testlist

    with tempfile.TemporaryDirectory() as tmp:
        probe_dir, tiny = Path(tmp) / "probe", Path(tmp) / "tiny.json"
        probe_dir.mkdir()
        (probe_dir / "sitecustomize.py").write_text(_PROBE)
        tiny.write_text(json.dumps([c.to_json() for c in load_testlist(resolve_testlist("gemm"))[:2]]))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(probe_dir), os.environ.get("PYTHONPATH", "")])}
        spawn_s = []
        for _ in range(args.repeats):
            done = subprocess.run([sys.executable, "-m", "operatorx", "run", "-t", str(tiny), "--device", args.device,
                                   "--db", str(Path(tmp) / "ox.db"), "--results-dir", str(Path(tmp) / "res")],
                                  env=env, capture_output=True, text=True)
            spawn_s += [float(line.split()[1]) for line in done.stderr.splitlines()
                        if line.startswith("OX_SPAWN_AFTER_S")][:1]
        help_s = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "operatorx", "--help"], capture_output=True)
            help_s.append(time.perf_counter() - t0)
    print(f"spawn after (s): min {min(spawn_s):.3f}, median {sorted(spawn_s)[len(spawn_s) // 2]:.3f} "
          f"({len(spawn_s)} runs, in order: {', '.join(f'{x:.2f}' for x in spawn_s)})")
    print(f"`operatorx --help` (s): min {min(help_s):.3f}, median {sorted(help_s)[len(help_s) // 2]:.3f} "
          f"(in order: {', '.join(f'{x:.2f}' for x in help_s)})")


if __name__ == "__main__":
    main()
