"""Write the first N cases of a testlist in the order a multi-GPU run hands them out (longest
estimated call first), as a testlist of their own.

    python bench/order_probe.py gemm 1000 /tmp/gemm_longest.json
    operatorx run -t /tmp/gemm_longest.json --gpus 0

A one-GPU run of that file against a one-GPU run in testlist order tells whether the order itself
changes how often the GPU caps its power (the heavy prefill GEMMs back to back instead of spread
through the list): the question behind two GPUs retrying more capped cases than one (§17).
"""

from __future__ import annotations

import json
import sys

from operatorx.run.plan import longest_first, select_cases
from operatorx.spec import load_testlist, resolve_testlist


def main() -> None:
    name, limit, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    chosen = select_cases(load_testlist(resolve_testlist(name)), None, limit)
    ordered = longest_first(chosen, lambda t: t[1])
    with open(out, "w") as f:
        json.dump([case.to_json() for _, case in ordered], f)
    print(f"{len(ordered)} cases of {name}, longest first, to {out}")


if __name__ == "__main__":
    main()
