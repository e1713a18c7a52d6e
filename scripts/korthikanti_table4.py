#!/usr/bin/env python3
"""Per-layer check against Korthikanti et al. 2022, Table 4 (arXiv 2205.05198).

Table 4 times one transformer layer of the 22B model (TP 8 on 8 A100-80GB) forward and
backward under five combinations of sequence parallelism and recompute. This script
simulates the suite's 22B run file under each combination with 12 layers (the per-layer
step does not depend on the depth at PP 1; a shorter stack keeps the no-recompute variant in
memory and the trace small), writes the Perfetto trace, and measures layer 6 of rank 0 as
the span of its tasks on the rank's streams: forward from the first "L6 fwd" task's start to
the last one's end, backward likewise over "L6 bwd" and "L6 recompute" (the recomputed
forward is part of the backward the paper times). Host-issue events are left out.

Usage: scripts/korthikanti_table4.py [path/to/hetpar]   (default build/cli/hetpar)
"""

import json
import os
import subprocess
import sys
import tempfile

RUN = os.path.join(os.path.dirname(__file__), "..", "validation", "runs",
                   "megatron-2022-gpt-22b-8xa100-selective.json")

# (label, sequence parallel, recompute, measured forward ms, measured backward ms): Table 4.
TABLE4 = [
    ("no recompute", False, "none", 7.7, 11.9),
    ("sequence parallel", True, "none", 7.2, 11.8),
    ("full recompute", False, "full", 7.7, 19.5),
    ("selective recompute", False, "selective", 7.7, 13.2),
    ("selective + sequence parallel", True, "selective", 7.2, 13.1),
]

LAYER = 6


def layer_spans(trace_path):
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = {"fwd": [None, None], "bwd": [None, None]}
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != 0 or e.get("cat") == "host":
            continue
        name = e.get("name", "")
        prefix = f"llm L{LAYER} "
        if not name.startswith(prefix):
            continue
        phase = name[len(prefix):].split(" ")[0]
        key = "fwd" if phase == "fwd" else "bwd" if phase in ("bwd", "recompute") else None
        if key is None:
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        span = spans[key]
        span[0] = start if span[0] is None else min(span[0], start)
        span[1] = end if span[1] is None else max(span[1], end)
    return {k: (v[1] - v[0]) / 1000.0 for k, v in spans.items()}  # us -> ms


def main():
    hetpar = sys.argv[1] if len(sys.argv) > 1 else "build/cli/hetpar"
    with open(RUN) as f:
        base = json.load(f)
    base.pop("measured", None)
    base["model"]["modules"][0]["spec"]["layers"] = 12
    print(f"{'configuration':32} {'fwd meas':>9} {'fwd sim':>8} {'bwd meas':>9} {'bwd sim':>8}"
          f" {'sum err':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, sp, recompute, fwd_ms, bwd_ms in TABLE4:
            scenario = json.loads(json.dumps(base))
            scenario["plan"]["sp"] = sp
            scenario["plan"]["recompute"] = recompute
            path = os.path.join(tmp, "scenario.json")
            trace = os.path.join(tmp, "trace.json")
            with open(path, "w") as f:
                json.dump(scenario, f)
            subprocess.run([hetpar, "simulate", path, "--trace", trace], check=True,
                           stdout=subprocess.DEVNULL)
            sim = layer_spans(trace)
            err = (sim["fwd"] + sim["bwd"]) / (fwd_ms + bwd_ms) - 1
            print(f"{label:32} {fwd_ms:9.1f} {sim['fwd']:8.2f} {bwd_ms:9.1f} {sim['bwd']:8.2f}"
                  f" {err:+8.1%}")


if __name__ == "__main__":
    main()
