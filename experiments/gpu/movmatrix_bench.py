"""Microbenchmark: does ``movmatrix`` (an in-register 8x8 b16 transpose) compete with ``ldmatrix`` for the SM's
shared-memory bandwidth?

The mma.sync backward's dK/dV kernel reads each step's dO tile twice (plain for dP^T = V dO^T, transposed for
dV += P^T dO). Reading it once and transposing the fragments with movmatrix only pays if movmatrix does not use the
same pipe as ldmatrix. Each mode runs the same number of iterations in 8-warp CTAs, several per SM:

  ldsm       ldmatrix.x4 only (4 8x8 matrices per instruction)
  movm       4 movmatrix per iteration, registers only
  ldsm+movm  one ldmatrix.x4 and 4 movmatrix per iteration (the fused pass's mix)
  ldsm2      two ldmatrix.x4 per iteration (the unfused pass's mix)

If ldsm+movm takes about as long as ldsm, movmatrix is nearly free beside ldmatrix; if it takes as long as ldsm2,
it costs a shared-memory read. That reading needs the pipes saturated: a run whose time per warp-iteration still
falls as ``--ctas-per-sm`` grows measures latency, not throughput (the first H100 run, at 1 and 2 CTAs per SM, did:
checks/movmatrix-h100-20261127T1322Z.json). The movmatrix results feed no later iteration, so no mode is a serial
chain of them. Writes ``$OUT/movmatrix-<gpu>.json`` (or ``--out``).

    python experiments/gpu/movmatrix_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256) bench(unsigned* out, int iters, int mode) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned* s = reinterpret_cast<unsigned*>(smem);
    for (int i = threadIdx.x; i < 8192; i += blockDim.x) s[i] = i * 2654435761u;
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // each lane points at one 16-byte row of an 8x8 matrix; rows of different lanes hit different banks
    unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem)) + warp * 4096 + lane * 16;
    unsigned r0 = lane, r1 = lane * 3, r2 = lane * 5, r3 = lane * 7, acc_m = 0;
    for (int it = 0; it < iters; ++it) {
        const unsigned addr = base + ((it & 7) << 9);
        if (mode == 0 || mode == 2 || mode == 3) {
            unsigned a, b, c, d;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr));
            r0 ^= a; r1 ^= b; r2 ^= c; r3 ^= d;
        }
        if (mode == 3) {
            unsigned a, b, c, d;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr ^ 256));
            r0 += a; r1 += b; r2 += c; r3 += d;
        }
        if (mode == 1 || mode == 2) {
            unsigned a, b, c, d;
            // sources independent of earlier movmatrix results (the loop counter), results only accumulated
            const unsigned src = it * 0x9e3779b9u;
            asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(a) : "r"(src ^ lane));
            asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(b) : "r"(src + lane));
            asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(c) : "r"(src - lane));
            asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(src | lane));
            acc_m ^= a ^ b ^ c ^ d;
        }
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = r0 ^ r1 ^ r2 ^ r3 ^ acc_m;
}
"""

MODES = {"ldsm": 0, "movm": 1, "ldsm+movm": 2, "ldsm2": 3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200000)
    parser.add_argument("--ctas-per-sm", type=int, default=6, help="32 KB smem and 256 threads each: up to 8 fit")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device(0)
    dev.set_current()
    major, minor = dev.compute_capability
    arch = f"sm_{major}{minor}"
    prog = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=arch, std="c++17"))
    kernel = prog.compile("cubin").get_kernel("bench")
    n_sm = dev.properties.multiprocessor_count
    clock_khz = dev.properties.clock_rate
    grid = n_sm * args.ctas_per_sm
    out = torch.empty(grid * 256, dtype=torch.int32, device="cuda")
    stream = dev.create_stream()
    cfg = LaunchConfig(grid=grid, block=256, shmem_size=32 * 1024)
    results = {}
    for name, mode in MODES.items():
        times = []
        for rep in range(args.reps + 1):
            stream.sync()
            t0 = time.perf_counter()
            launch(stream, cfg, kernel, out.data_ptr(), np.int32(args.iters), np.int32(mode))
            stream.sync()
            if rep:  # the first launch warms up
                times.append(time.perf_counter() - t0)
        med = float(np.median(times))
        warp_iters_per_sm = args.ctas_per_sm * 8 * args.iters
        results[name] = {"median_s": med, "min_s": min(times), "max_s": max(times),
                         "clk_per_warp_iter_per_sm": med * clock_khz * 1e3 / warp_iters_per_sm}
    base = results["ldsm"]["median_s"]
    for name in results:
        results[name]["vs_ldsm"] = results[name]["median_s"] / base
    record = {"gpu": torch.cuda.get_device_name(0), "arch": arch, "sms": n_sm, "clock_khz": clock_khz,
              "iters": args.iters, "ctas_per_sm": args.ctas_per_sm, "reps": args.reps, "modes": results}
    print(f"{'mode':<12}{'median ms':>11}{'clk/warp-iter/SM':>18}{'vs ldsm':>9}")
    for name, r in results.items():
        print(f"{name:<12}{r['median_s'] * 1e3:>11.3f}{r['clk_per_warp_iter_per_sm']:>18.2f}{r['vs_ldsm']:>9.2f}")
    path = args.out or os.path.join(os.environ.get("OUT", "."), f"movmatrix-{arch}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
