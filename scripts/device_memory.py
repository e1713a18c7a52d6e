#!/usr/bin/env python3
"""Memory-bound kernels of a training step on one GPU, through PyTorch, eager and compiled.

Evidence for the profiles' `gpu.memory_efficiency` (the fraction of the HBM datasheet rate a
streaming kernel reaches; hetpar times every memory-bound op as launch + its bytes / that
rate, planner/src/cost_model.cpp). Each op's bytes are the fewest it must move (every input
read once, every output written once); the achieved rate is those bytes over the median of
50 calls timed with events after 5 warm-ups, and again per call of 10 captured in one CUDA
graph (no host time between kernels). Shapes: a Llama 3 8B layer's at 8192 tokens
(hidden 4096, MLP 14336, vocabulary 128256), bf16. Run on the device machine by
scripts/device_check.sh; prints one table, --json writes the rows.
"""
import argparse
import json

import torch
import torch.nn.functional as F

from device_timing import median_call_s

T, H, FF, V = 8192, 4096, 14336, 128256
BF = torch.bfloat16


def timed(fn, reps=50):
    return median_call_s(fn, 5, reps)


def timed_graph(fn, per_graph=10, replays=10):
    """The median time per call of `per_graph` calls captured in one CUDA graph: no host
    time between kernels (a compiled function's guards cost 50-100 us of Python a call)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    return median_call_s(g.replay, 1, replays) / per_graph


def rnd(*shape, grad=False):
    return torch.randn(*shape, device="cuda", dtype=BF, requires_grad=grad)


def cases():
    x, y, out = rnd(T, H), rnd(T, H), rnd(T, H)
    w = torch.ones(H, device="cuda", dtype=BF, requires_grad=True)
    xg = rnd(T, H, grad=True)
    dy = rnd(T, H)
    a, b = rnd(T, FF, grad=True), rnd(T, FF, grad=True)
    dz = rnd(T, FF)
    e = 2  # bytes per bf16 element

    def norm(t, weight):
        return F.rms_norm(t, (H,), weight, 1e-5)

    def swiglu(p, q):
        return F.silu(p) * q

    def fp8_cast(t):
        amax = t.abs().amax().float()
        return (t.float() * (448.0 / amax)).to(torch.float8_e4m3fn)

    norm_c = torch.compile(norm)
    swiglu_c = torch.compile(swiglu)
    fp8_c = torch.compile(fp8_cast)

    def fwd_bwd(f, ins, grad_out):
        def run():
            o = f(*ins)
            o.backward(grad_out)
        return run

    rows = [
        ("copy", lambda: out.copy_(x), 2 * T * H * e),
        ("residual add", lambda: torch.add(x, y, out=out), 3 * T * H * e),
        ("rms_norm fwd eager", lambda: norm(x, w), 2 * T * H * e),
        ("rms_norm fwd compiled", lambda: norm_c(x, w), 2 * T * H * e),
        # fwd + bwd: x read twice (fwd, bwd), y written, dy read, dx written
        ("rms_norm fwd+bwd eager", fwd_bwd(norm, (xg, w), dy), 5 * T * H * e),
        ("rms_norm fwd+bwd compiled", fwd_bwd(norm_c, (xg, w), dy), 5 * T * H * e),
        ("swiglu fwd eager", lambda: swiglu(a, b), 3 * T * FF * e),
        ("swiglu fwd compiled", lambda: swiglu_c(a, b), 3 * T * FF * e),
        # fwd 3, bwd: a, b, dz read, da, db written
        ("swiglu fwd+bwd eager", fwd_bwd(swiglu, (a, b), dz), 8 * T * FF * e),
        ("swiglu fwd+bwd compiled", fwd_bwd(swiglu_c, (a, b), dz), 8 * T * FF * e),
        ("fp8 cast+amax eager", lambda: fp8_cast(x), T * H * e + T * H),
        ("fp8 cast+amax compiled", lambda: fp8_c(x), T * H * e + T * H),
    ]
    del xg
    return rows


def loss_rows():
    logits = torch.randn(T, V, device="cuda", dtype=BF, requires_grad=True)
    target = torch.randint(0, V, (T,), device="cuda")

    def ce():
        loss = F.cross_entropy(logits.float(), target)
        loss.backward()
    # logits read (fwd) and read again and their gradient written (bwd)
    return [("cross-entropy fwd+bwd (fp32 upcast)", ce, 3 * T * V * 2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    peak = 4.8e12  # H200 datasheet; the script reports the fraction of it and the GB/s
    out = []
    for name, fn, nbytes in cases() + loss_rows():
        try:
            t = timed(fn)
        except Exception as ex:  # a compile failure names itself and the rest goes on
            out.append({"op": name, "error": str(ex)[:160]})
            print(f"{name:<38} error: {str(ex)[:100]}")
            continue
        try:
            tg = timed_graph(fn)
        except Exception as ex:  # not capturable: the plain time only
            print(f"{name:<38} graph capture failed: {str(ex)[:80]}")
            tg = float("nan")
        out.append({"op": name, "bytes": nbytes, "median_s": t, "graph_median_s": tg,
                    "GBps": nbytes / t / 1e9, "graph_GBps": nbytes / tg / 1e9})
        print(f"{name:<38} {nbytes / 2**20:8.1f} MiB {t * 1e6:8.1f} us {tg * 1e6:8.1f} us "
              f"graphed {nbytes / tg / 1e9:7.1f} GB/s {nbytes / tg / peak:6.3f} of 4.8 TB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
