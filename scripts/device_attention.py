#!/usr/bin/env python3
"""Attention and GEMM rates on one GPU, burst and sustained, through PyTorch.

Evidence for the built-in profiles' `gpu.attention` (cuDNN fused attention, the kernel
Transformer Engine runs on Hopper) and `gpu.attention.sustain` (the fraction of a burst
rate a GPU holds at its power limit), which hetpar's own cuda backend cannot measure: its
attention is a batched-GEMM reference, not a fused kernel. Run on the device machine by
scripts/device_check.sh (PyTorch is there, not here).

Conventions are hetpar's (docs/calibration.md): causal forward FLOPs 4*b*h*s^2*d / 2;
backward quoted in FlashAttention's convention, 2.5x forward. "burst": 3 warm-ups, then 20
calls each timed alone, median. "sustained": the call back to back for SUSTAIN_S seconds,
then 20 back-to-back calls timed together (the power-limited steady state). Inputs are
random normal (zeros run faster on this chip). Prints one table; --json writes the rows.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from device_timing import median, median_call_s, sustained_call_s

SUSTAIN_S = 2.0


def timed_burst(fn, reps=20):
    return median_call_s(fn, 3, reps)


def timed_sustained(fn, reps=20):
    return sustained_call_s(fn, SUSTAIN_S, reps)


def attention_rows(backend, name, shapes):
    """Shapes (batch, heads, kv heads, sequence, head dim[, causal]); causal unless a sixth
    field says otherwise (an encoder's call is unmasked: its FLOPs are not halved)."""
    rows = []
    for shape in shapes:
        b, h, hkv, s, d = shape[:5]
        causal = shape[5] if len(shape) > 5 else True
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        gqa = hkv != h
        fwd_flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        with sdpa_kernel([backend]):
            try:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                out.backward(torch.randn_like(out))
            except RuntimeError as e:  # the backend refuses the shape
                rows.append({"kernel": name, "shape": [b, h, hkv, s, d], "causal": causal,
                             "error": str(e)[:120]})
                continue
            grad = torch.randn_like(out)

            def fwd():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                o.backward(grad)

            row = {"kernel": name, "shape": [b, h, hkv, s, d], "causal": causal}
            for mode, timer in (("burst", timed_burst), ("sustained", timed_sustained)):
                tf = timer(fwd)
                tfb = timer(fwd_bwd)
                tb = max(tfb - tf, 1e-9)
                row[mode] = {
                    "fwd_s": tf, "bwd_s": tb,
                    "fwd_tflops": fwd_flops / tf / 1e12,
                    "bwd_tflops": 2.5 * fwd_flops / tb / 1e12,
                }
            rows.append(row)
        del q, k, v
    return rows


def window_rows(b=1, h=64, hkv=8, s=4096, d=64, window=128):
    """The sliding-window rule of the cost model (docs/validation.md round 39): a call whose
    queries each see themselves and `window` keys before them runs at the rate of a causal
    call of 2*window keys. Measured with PyTorch's FlexAttention (a block-sparse kernel that
    skips the tiles outside its mask, as cuDNN's and FlashAttention's windowed kernels do):
    gpt-oss-120b's per-rank shape windowed, the same causal at 2*window, and causal at s.
    FLOPs in hetpar's convention: the band's s*w - w^2/2 pairs. Burst rates only. A missing
    FlexAttention (older PyTorch) is reported, not fatal."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    except Exception as e:  # noqa: BLE001 (any import or compile failure is reported)
        return [{"kernel": "flex window", "shape": [b, h, hkv, s, d, window],
                 "error": f"no FlexAttention: {str(e)[:100]}"}]
    rows = []
    for name, seq, w in (("flex window", s, window), ("flex causal", 2 * window, 0),
                         ("flex causal", s, 0)):
        def mask(bi, hi, qi, ki, w=w):
            return (qi >= ki) & ((qi - ki <= w) if w > 0 else (qi >= ki))
        try:
            block = create_block_mask(mask, None, None, seq, seq, device="cuda")
            q = torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, hkv, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, hkv, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            out = flex(q, k, v, block_mask=block, enable_gqa=hkv != h)
            grad = torch.randn_like(out)
            out.backward(grad)
            pairs = seq * w - w * w / 2 if w > 0 else seq * seq / 2
            fwd_flops = 4.0 * b * h * pairs * d
            tf = timed_burst(lambda: flex(q, k, v, block_mask=block, enable_gqa=hkv != h))

            def fwd_bwd():
                flex(q, k, v, block_mask=block, enable_gqa=hkv != h).backward(grad)

            tb = max(timed_burst(fwd_bwd) - tf, 1e-9)
            rows.append({"kernel": name, "shape": [b, h, hkv, seq, d, w], "causal": True,
                         "burst": {"fwd_s": tf, "bwd_s": tb,
                                   "fwd_tflops": fwd_flops / tf / 1e12,
                                   "bwd_tflops": 2.5 * fwd_flops / tb / 1e12}})
        except Exception as e:  # noqa: BLE001
            rows.append({"kernel": name, "shape": [b, h, hkv, seq, d, w],
                         "error": str(e)[:120]})
    return rows


def gemm_rows(shapes):
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        row = {"kernel": "bf16 matmul", "shape": [m, n, k]}
        for mode, timer in (("burst", timed_burst), ("sustained", timed_sustained)):
            row[mode] = {"tflops": flops / timer(lambda: a @ bt.t()) / 1e12}
        a8, b8 = a.to(torch.float8_e4m3fn), bt.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        row8 = {"kernel": "fp8 _scaled_mm", "shape": [m, n, k]}
        try:
            for mode, timer in (("burst", timed_burst), ("sustained", timed_sustained)):
                f = lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                             out_dtype=torch.bfloat16)
                row8[mode] = {"tflops": flops / timer(f) / 1e12}
        except RuntimeError as e:
            row8["error"] = str(e)[:120]
        rows += [row, row8]
    return rows


def mix_rows(b=1, h=32, hkv=8, s=8192, d=128, m=8192, n=28672, k=4096):
    """A training step's mix at the power limit: per round two GEMMs (an MLP's fc1) and one
    attention forward and backward, back to back for SUSTAIN_S, then 20 rounds with each op
    timed by its own events. Says what attention runs at beside GEMMs (the profiles'
    gpu.attention.sustain) and what GEMMs run at beside attention."""
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kk = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fwd_flops = 4.0 * b * h * s * s * d / 2
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        o = F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=True)
        grad = torch.randn_like(o)
        ev = lambda: torch.cuda.Event(enable_timing=True)

        def one_round(times):  # GEMMs ~60% of the round's time, as in a dense layer
            e = [ev() for _ in range(5)]
            e[0].record()
            a @ w.t()
            e[1].record()
            o = F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=True)
            e[2].record()
            a @ w.t()
            e[3].record()
            o.backward(grad)
            e[4].record()
            if times is not None:
                times.append(e)

        t0 = time.monotonic()
        while time.monotonic() - t0 < SUSTAIN_S:
            one_round(None)
            torch.cuda.synchronize()
        times = []
        for _ in range(20):
            one_round(times)
        torch.cuda.synchronize()
    g = median([e[0].elapsed_time(e[1]) for e in times] + [e[2].elapsed_time(e[3]) for e in times])
    g *= 1e-3
    f = median([e[1].elapsed_time(e[2]) for e in times]) * 1e-3
    bw = median([e[3].elapsed_time(e[4]) for e in times]) * 1e-3
    return [{"kernel": "mix", "shape": [b, h, hkv, s, d, m, n, k],
             "gemm_tflops": 2.0 * m * n * k / g / 1e12, "fwd_tflops": fwd_flops / f / 1e12,
             "bwd_tflops": 2.5 * fwd_flops / bw / 1e12}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", choices=["mix"], help="just the GEMM + attention mix")
    args = ap.parse_args()
    torch.manual_seed(0)
    # (batch, heads, kv heads, sequence, head dim): the validation runs' per-rank attention
    # (Llama 8B 32/8 heads, 70B and 405B 16/1-2 per TP rank, Nemotron 15B 48/8; 2k-8k).
    shapes = [(1, 32, 8, 8192, 128), (1, 16, 2, 8192, 128), (1, 32, 8, 4096, 128),
              (1, 16, 2, 4096, 128), (2, 48, 8, 4096, 128), (4, 32, 8, 2048, 128),
              (8, 16, 16, 1024, 128)]
    # Head dim 64 against 128 (the third shape at half the head dim), and the encoders'
    # unmasked calls at head dim 64 (CLIP ViT-L/14-336: 16 heads over 577 tokens, 32 images;
    # Whisper large-v3's encoder: 20 heads over 1500 frames, 8 clips): the evidence a model
    # of attention's cost against the head dim needs (docs/calibration.md, the score
    # elements' time), which the fused kernels' rates at 128 alone cannot give.
    shapes += [(1, 32, 8, 4096, 64), (32, 16, 16, 577, 64, False), (8, 20, 20, 1500, 64, False)]
    if args.only == "mix":
        rows = mix_rows()
        for r in rows:
            print(f"mix {r['shape']}: gemm {r['gemm_tflops']:.1f}  attention fwd "
                  f"{r['fwd_tflops']:.1f} bwd {r['bwd_tflops']:.1f} TFLOP/s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
        return
    rows = attention_rows(SDPBackend.CUDNN_ATTENTION, "cudnn", shapes)
    rows += attention_rows(SDPBackend.FLASH_ATTENTION, "flash2", shapes[:3])
    rows += mix_rows()
    rows += window_rows()
    rows += gemm_rows([(8192, 8192, 8192), (4096, 4096, 4096), (8192, 28672, 4096)])
    print(f"{'kernel':<15} {'shape':<26} {'burst fwd/bwd':>18} {'sustained fwd/bwd':>20} "
          f"{'ratio':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<15} {str(r['shape']):<26} error: {r['error']}")
        elif r["kernel"] == "mix":
            print(f"mix: gemm {r['gemm_tflops']:.1f}, cudnn fwd {r['fwd_tflops']:.1f} bwd "
                  f"{r['bwd_tflops']:.1f} TFLOP/s beside each other, {r['shape']}")
        elif r["kernel"].startswith("flex"):
            bu = r["burst"]
            print(f"{r['kernel']:<15} {str(r['shape']):<26} "
                  f"{bu['fwd_tflops']:8.1f} {bu['bwd_tflops']:8.1f}  (burst only)")
        elif "fwd_tflops" in r["burst"]:
            bu, su = r["burst"], r["sustained"]
            shape = str(r["shape"]) + ("" if r.get("causal", True) else " unmasked")
            print(f"{r['kernel']:<15} {shape:<26} "
                  f"{bu['fwd_tflops']:8.1f} {bu['bwd_tflops']:8.1f}  "
                  f"{su['fwd_tflops']:9.1f} {su['bwd_tflops']:9.1f}  "
                  f"{su['fwd_tflops'] / bu['fwd_tflops']:5.3f} "
                  f"{su['bwd_tflops'] / bu['bwd_tflops']:5.3f}")
        else:
            bu, su = r["burst"]["tflops"], r["sustained"]["tflops"]
            print(f"{r['kernel']:<15} {str(r['shape']):<26} {bu:17.1f}  {su:19.1f}  "
                  f"{su / bu:5.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "sustain_s": SUSTAIN_S,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
