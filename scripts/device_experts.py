#!/usr/bin/env python3
"""A MoE layer's expert GEMMs on one GPU as Transformer Engine runs them, through PyTorch.

Evidence for the validation suite's largest gap (docs/validation.md, "Still missing"): every
MoE layout with its EP group inside one node is predicted far too fast, and the first
candidate is the grouped expert GEMMs. Megatron-Core's experts are Transformer Engine's
GroupedLinear, which launches one cuBLAS GEMM per local expert, round-robin on 4 compute
streams that first wait for the main stream and that it waits for at the end
(multi_stream_cublas_gemm, common/gemm/cublaslt_gemm.cpp; num_compute_streams 4). hetpar's
cost model times them as rounds of four batched products at its GEMM model's rate
(`hetpar simulate RUN --ops`, rows expert_fc1 / expert_fc2: forward, dgrad, wgrad). This
script times the same GEMMs per pass:
  te4     per expert, on 4 streams, as Transformer Engine issues them;
  serial  per expert, on one stream;
  grouped one torch._grouped_mm call (where this PyTorch has it; CUTLASS's grouped kernel);
  dense   one GEMM of all the rows (the rate the same FLOPs reach in one large GEMM).
Shapes are per rank of the suite's rows (local experts, rows per expert at the load the
model charges, hidden, the expert's FFN width; fc1 gated: N = 2 x FFN). BF16, FP8 through
torch._scaled_mm with per-tensor scales (current scaling's GEMM; its quantisation kernels are
not timed here). "burst": median of 20 calls each timed alone; "sustained": back to back for
--sustain seconds, then 20 timed together. Weight gradients are written in the GEMM's dtype
(Megatron's fused accumulation into fp32 main_grad is not emulated). Prints one table;
--json writes the rows. Run on the device machine by scripts/device_check.sh.
"""
import argparse
import json

import torch

from device_timing import median_call_s, sustained_call_s

STREAMS = 4  # Transformer Engine's num_compute_streams

# (row, local experts, rows per expert, hidden, expert FFN, also in FP8): the suite's MoE
# rows per rank. Rows per expert rounded to a multiple of 16, as FP8 GEMMs need (Megatron
# pads FP8 experts' inputs so, moe_router_padding_for_fp8).
CASES = [
    # 128 experts top-4 over EP 8, 4096 tokens a micro-batch, forced balance.
    ("gpt-oss-120b ep8 mbs1 (26.02 H100)", 16, 1024, 2880, 2880, False),
    ("gpt-oss-120b ep8 mbs4 (B200 rows)", 16, 4096, 2880, 2880, False),
    # 128 experts top-8 over EP 8: micro-batch 2 (the 25.09 / 25.11 FP8 rows), 1 (Megatron-LM's
    # BF16 recipe, the mlm-recipes row).
    ("qwen3-30b ep8 mbs2", 16, 4096, 2048, 768, True),
    ("qwen3-30b ep8 mbs1", 16, 2048, 2048, 768, True),
    # Megatron-MoE-ModelZoo: TP 4 / EP 8 (512 rows an expert at the mean, 1.6x at the
    # hottest rank, which the model charges: 819) and EP 32 (4 experts, 4096 x 1.6 rows).
    ("qwen3-235b tp4-ep8 hottest", 16, 816, 4096, 1536, False),
    ("qwen3-235b ep32 hottest", 4, 6560, 4096, 1536, False),
]


def gemm_fn(dtype):
    """(a [m, k], b [n, k]) -> a @ b^T in `dtype` (bf16 or fp8 through _scaled_mm)."""
    if dtype == "bf16":
        return lambda a, b: a @ b.t()
    one = torch.ones((), device="cuda")
    return lambda a, b: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                         out_dtype=torch.bfloat16)


def operands(experts, m, n, k, dtype):
    """Per expert an (m x k) activation and an (n x k) weight, row-major as cuBLAS takes
    them (TN); fp8 cast from bf16 random normals."""
    a = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(experts)]
    b = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(experts)]
    if dtype == "fp8":
        a = [t.to(torch.float8_e4m3fn) for t in a]
        b = [t.to(torch.float8_e4m3fn) for t in b]
    return a, b


def variants(experts, m, n, k, dtype):
    """name -> a callable running the pass's `experts` GEMMs once."""
    mm = gemm_fn(dtype)
    a, b = operands(experts, m, n, k, dtype)
    main = torch.cuda.current_stream()
    side = [torch.cuda.Stream() for _ in range(STREAMS)]

    def te4():
        start = torch.cuda.Event()
        start.record(main)
        for s in side:
            s.wait_event(start)
        for e in range(experts):
            with torch.cuda.stream(side[e % STREAMS]):
                mm(a[e], b[e])
        for s in side:
            done = torch.cuda.Event()
            done.record(s)
            main.wait_event(done)

    def serial():
        for e in range(experts):
            mm(a[e], b[e])

    out = {"te4": te4, "serial": serial}
    rows = torch.cat(a) if dtype == "bf16" else None
    if rows is not None:
        out["dense"] = lambda: rows @ b[0].t()
        if hasattr(torch, "_grouped_mm"):
            w = torch.stack(b).transpose(1, 2)  # [experts, k, n]
            offs = torch.arange(m, m * experts + 1, m, device="cuda", dtype=torch.int32)
            out["grouped"] = lambda: torch._grouped_mm(rows, w, offs=offs)
    return out


def case_rows(name, experts, rows, hidden, ffn, dtype, sustain):
    """Both expert linears' three passes (fc1 gated: 2 x ffn wide)."""
    out = []
    for linear, n_out, k_in in (("fc1", 2 * ffn, hidden), ("fc2", hidden, ffn)):
        for pas, (m, n, k) in (("fwd", (rows, n_out, k_in)), ("dgrad", (rows, k_in, n_out)),
                               ("wgrad", (n_out, k_in, rows))):
            flops = 2.0 * m * n * k * experts
            row = {"case": name, "dtype": dtype, "linear": linear, "pass": pas,
                   "experts": experts, "gemm": [m, n, k], "tflops": {}, "us": {},
                   "errors": {}}
            try:
                fns = variants(experts, m, n, k, dtype)
            except Exception as e:  # noqa: BLE001 (reported, the other passes go on)
                row["error"] = str(e)[:160]
                fns = {}
            for v, fn in fns.items():  # a variant that fails leaves the others' timings
                try:
                    tb = median_call_s(fn, 3, 20)
                    ts = sustained_call_s(fn, sustain, 20) if sustain > 0 else tb
                except Exception as e:  # noqa: BLE001
                    row["errors"][v] = str(e)[:160]
                    continue
                row["us"][v] = {"burst": tb * 1e6, "sustained": ts * 1e6}
                row["tflops"][v] = {"burst": flops / tb / 1e12, "sustained": flops / ts / 1e12}
            out.append(row)
            torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--sustain", type=float, default=0.3,
                    help="seconds each variant runs back to back before its sustained timing")
    ap.add_argument("--fp8", action="store_true",
                    help="also time the FP8 rows' GEMMs in FP8")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for dtype in ["bf16"] + (["fp8"] if args.fp8 else []):
        for *case, fp8 in CASES:
            if dtype == "bf16" or fp8:
                rows += case_rows(*case, dtype, args.sustain)
    names = ["te4", "serial", "grouped", "dense"]
    print(f"{'case':<36} {'dt':<4} {'pass':<10} {'experts x (m, n, k)':<24} "
          + " ".join(f"{v:>15}" for v in names) + "   (TFLOP/s sustained, us)")
    for r in rows:
        what = f"{r['experts']} x {tuple(r['gemm'])}"
        head = f"{r['case']:<36} {r['dtype']:<4} {r['linear'] + ' ' + r['pass']:<10} {what:<24}"
        if "error" in r:
            print(f"{head} error: {r['error']}")
            continue
        cells = []
        for v in names:
            t = r["tflops"].get(v)
            cells.append(f"{t['sustained']:6.1f} {r['us'][v]['sustained']:7.1f}" if t else
                         "error" if v in r["errors"] else "-")
        print(head + " " + " ".join(f"{c:>15}" for c in cells))
        for v, e in r["errors"].items():
            print(f"  {v}: {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "streams": STREAMS, "sustain_s": args.sustain, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
