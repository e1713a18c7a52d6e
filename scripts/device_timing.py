"""Event timing shared by the device scripts (device_attention.py, device_memory.py,
device_experts.py)."""
import time

import torch


def median(xs):
    """The middle value (the upper one of an even count), as the scripts report."""
    return sorted(xs)[len(xs) // 2]


def median_call_s(fn, warmups, reps):
    """`warmups` untimed calls, then the median of `reps` calls each timed alone with CUDA
    events, in seconds."""
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return median(times)


def sustained_call_s(fn, sustain_s, reps):
    """`fn` back to back for `sustain_s` seconds (the GPU at its power limit), then `reps`
    back-to-back calls timed together with CUDA events: seconds per call."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < sustain_s:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e-3 / reps
