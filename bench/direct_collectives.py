#!/usr/bin/env python3
"""All-gather, broadcast, reduce-scatter and out-of-place all-reduce on ordinary arrays beside
registered shareable ones (ring's direct path between the processes of one host), interleaved, one
replica per process.

tributary-bench measures all-reduces only; this covers the other collectives that the direct path
serves. Busbw follows nccl-tests: all-gather and reduce-scatter (total bytes) x (n-1)/n / time,
broadcast bytes / time, all-reduce bytes x 2(n-1)/n / time. Each size and line runs --rounds
times in a rotated order; the median is printed with the range. Run it under the launcher, with the Python module
built (the build tree's python/ on PYTHONPATH):

  PYTHONPATH=build/python build/tools/tributary-run -n 2 python3 bench/direct_collectives.py \\
      --sizes 1M,16M,64M
"""
import argparse
import statistics
import sys
import time

import numpy as np

import tributary


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(call, iters, warmup):
    for _ in range(warmup):
        call()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) / iters


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="ring")
    p.add_argument("--sizes", default="1M,16M,64M",
                   help="bytes per rank's block (all-gather, reduce-scatter) and message "
                        "(broadcast, all-reduce)")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    ops = tributary.backend(a.backend)
    n, rank = ops.world_size, ops.rank
    if n < 2:
        sys.exit("direct_collectives: run it under tributary-run -n N (N >= 2)")
    lines = ("ordinary", "shareable")
    figures = {}  # (size, collective, line) -> [busbw]
    for size in (parse_size(s) for s in a.sizes.split(",")):
        count = max(1, size // 4)
        for r in range(a.rounds):
            for line in lines[r % 2:] + lines[:r % 2]:
                def make(elements):
                    if line == "shareable":
                        return tributary.shareable_array(elements, np.float32)
                    return np.zeros(elements, np.float32)
                out, src = make(count * n), make(count)
                out[:] = rank
                src[:] = rank + 1
                regs = [ops.register_buffers([out]), ops.register_buffers([src])] \
                    if line == "shareable" else []
                block = out[rank * count:(rank + 1) * count]
                whole = count * 4
                t = timed(lambda: ops.all_gather([block], [out]), a.iters, a.warmup)
                figures.setdefault((size, "all_gather", line), []).append(
                    whole * n * (n - 1) / n / t / 1e9)
                t = timed(lambda: ops.broadcast(out[:count], [out[:count]], root=0), a.iters,
                          a.warmup)
                figures.setdefault((size, "broadcast", line), []).append(whole / t / 1e9)
                t = timed(lambda: ops.all_reduce([src], [out[:count]]), a.iters, a.warmup)
                figures.setdefault((size, "all_reduce out of place", line), []).append(
                    whole * 2 * (n - 1) / n / t / 1e9)
                scattered = np.zeros(count, np.float32)
                t = timed(lambda: ops.reduce_scatter([out], [scattered]), a.iters, a.warmup)
                figures.setdefault((size, "reduce_scatter", line), []).append(
                    whole * n * (n - 1) / n / t / 1e9)
                for reg in regs:
                    reg.release()
    if rank != 0:
        return
    print(f"# {a.backend}, {n} processes, float32, busbw GB/s: median (range) of {a.rounds} "
          "rounds; shareable = tributary.shareable_array, registered")
    print(f"{'size':>8} {'collective':<24} {'ordinary':>22} {'shareable':>22}")
    for (size, coll, line), _ in sorted(figures.items()):
        if line != "ordinary":
            continue
        cells = []
        for l in lines:
            v = figures[(size, coll, l)]
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"{size >> 10:>7}K {coll:<24} {cells[0]:>22} {cells[1]:>22}")


if __name__ == "__main__":
    main()
