#!/usr/bin/env python3
"""Scatter/gather check against Narayanan et al. 2021, Figure 18 (arXiv 2104.04473).

Figure 18 times GPT-3 175B (96 layers, hidden 12288, 96 heads) on 96 A100-80GB, TP 8, PP 12,
interleaved with 2 layers per virtual stage (vpp 4), micro-batch 1, full recompute, at
global batch 12 to 60, with and without the scatter/gather pipeline transfers
(examples/sc21/run_figure_18.sh), and credits scatter/gather with up to 11% more throughput
at large batch. This script derives each case from the suite's 145B run file (the same
software: fp16, blocking transfers, no TP backward overlap, unfused gradient accumulation),
simulates it with and without `pp_scatter_gather`, and prints the iteration times and the
gain; with `--free` also without `pp_blocking_p2p`, to show what the blocking calls add.

Usage: scripts/narayanan_figure18.py [--free] [path/to/hetpar]   (default build/cli/hetpar)
"""

import copy
import json
import os
import subprocess
import sys
import tempfile

RUN = os.path.join(os.path.dirname(__file__), "..", "validation", "runs",
                   "megatron-2021-gpt-145b-1536xa100.json")
BATCHES = [12, 24, 36, 48, 60]


def scenario(base, gbs, scatter_gather, blocking):
    s = copy.deepcopy(base)
    s.pop("measured", None)
    s["name"] = f"figure18-gbs{gbs}-sg{int(scatter_gather)}-blocking{int(blocking)}"
    s["model"]["name"] = "gpt-175b"
    s["model"]["modules"][0]["spec"]["layers"] = 96
    s["cluster"]["nodes"] = 12
    s["workload"]["global_batch"] = gbs
    s["plan"].update(pp=12, vpp=4, dp=1, micro_batch=1, pp_scatter_gather=scatter_gather,
                     pp_blocking_p2p=blocking)
    return s


def iteration_time(hetpar, s, tmp):
    path = os.path.join(tmp, s["name"] + ".json")
    with open(path, "w") as f:
        json.dump(s, f)
    out = subprocess.run([hetpar, "simulate", "--json", path], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)["iteration_time_s"]


def main():
    args = [a for a in sys.argv[1:] if a != "--free"]
    hetpar = args[0] if args else os.path.join("build", "cli", "hetpar")
    with open(RUN) as f:
        base = json.load(f)
    modes = [True, False] if "--free" in sys.argv[1:] else [True]
    print(f"{'gbs':>4} {'transfers':>9} {'scatter/gather':>15} {'whole tensors':>14} {'gain':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for gbs in BATCHES:
            for blocking in modes:
                with_sg = iteration_time(hetpar, scenario(base, gbs, True, blocking), tmp)
                without = iteration_time(hetpar, scenario(base, gbs, False, blocking), tmp)
                print(f"{gbs:>4} {'blocking' if blocking else 'free':>9} {with_sg:>13.3f} s "
                      f"{without:>12.3f} s {100 * (without / with_sg - 1):>5.1f}%")
    print("Figure 18 (measured): scatter/gather up to 11% faster at large batch")


if __name__ == "__main__":
    main()
