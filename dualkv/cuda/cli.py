"""``dualkv kernels``: compile every kernel specialization (no GPU needed) and report resources.

ptxas's register allocation moves with the NVRTC version, and at 255 registers the mma.sync backward's spills moved a
lot between 13.0 and 13.5 (experiments/results/checks/s28spills-cpu-20261129.log): ``--nvrtc-lib DIR`` compiles with
another NVRTC (e.g. a GPU machine's, unpacked from its ``nvidia-cuda-nvrtc`` wheel) to see what that machine runs, as
``$DUALKV_NVRTC_LIB`` does for every compilation of a process (dualkv/cuda/build.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from tqdm.auto import tqdm

from ..cli import subcommand
from .build import KernelBuildError, compile_spec, nvrtc_from_env, nvrtc_version, resource_usage
from .configs import ARCHS, KERNELS, all_specs


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile-only", action="store_true",
                   help="only compile (the default; kept for explicitness: running needs no GPU either way)")
    p.add_argument("--arch", action="append", choices=ARCHS, help="target architecture (repeatable; default: all)")
    p.add_argument("--resources", action="store_true", help="recompile with ptxas -v and print registers/spills")
    p.add_argument("--json", metavar="PATH", help="write per-spec results as JSON")
    p.add_argument("--kernel", action="append", choices=KERNELS, help="only this kernel (repeatable)")
    p.add_argument("--nvrtc-lib", metavar="DIR", help="compile with the NVRTC in DIR (libnvrtc.so.* and its builtins, "
                   "e.g. nvidia/cu13/lib of an unpacked nvidia-cuda-nvrtc wheel) instead of the installed one")
    p.add_argument("--jobs", type=int, default=2, help="parallel NVRTC compilations")
    p.add_argument("--no-progress", action="store_true")


def _run(args: argparse.Namespace) -> int:
    if args.nvrtc_lib:  # (as DUALKV_NVRTC_LIB, so that the two cannot name different folders in one process)
        os.environ["DUALKV_NVRTC_LIB"] = args.nvrtc_lib
        try:
            nvrtc_from_env()
        except KernelBuildError as err:
            print(f"dualkv kernels: {err}", file=sys.stderr)
            return 2
        print(f"NVRTC {nvrtc_version()} from {args.nvrtc_lib}", file=sys.stderr)
    import cuda.core  # noqa: F401  (import once here: concurrent first imports from worker threads race)

    specs = [spec for arch in (args.arch or ARCHS) for spec in all_specs(arch)
             if not args.kernel or spec.kernel in args.kernel]
    results, failures = [], []

    def build(spec):
        try:
            built = compile_spec(spec, use_cache=not args.resources, verbose=args.resources)
            return spec, built, None
        except KernelBuildError as err:
            return spec, None, str(err)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for spec, built, err in tqdm(pool.map(build, specs), total=len(specs), desc="compiling kernels",
                                     disable=args.no_progress, file=sys.stderr):
            row = {"kernel": spec.kernel, "arch": spec.arch, "head_dim": spec.head_dim, "dtype": spec.dtype,
                   "pack": spec.pack, "window": spec.window, "causal": spec.causal, "tree": spec.tree,
                   "root_first": spec.root_first, "split_tiles": spec.split_tiles, "tile": repr(spec.tile),
                   "smem_bytes": spec.smem_bytes, "dq_mode": _dq_mode(spec), "ok": err is None}
            if built is not None and built.log:
                row.update(resource_usage(built.log))
            if built is not None and (chosen := dict(built.defines).get("DKV_DKDV_ADDR32")):
                row["ldmatrix_addr32"] = int(chosen)  # the mode compile_spec kept (build.compiler_chosen_macros)
            if built is not None and (chosen := dict(built.defines).get("DKV_FWD_TILE_SMEM")):
                row["tile_smem"] = int(chosen)  # likewise
            if err:
                failures.append(err)
            results.append(row)
    if args.resources:
        for r in results:
            print(f"{r['arch']} {r['kernel']} d={r['head_dim']:<3} {r['dtype']} pack={r['pack']} "
                  f"window={int(r['window'])} causal={int(r['causal'])}"
                  + (f" dq={r['dq_mode']}" if r["dq_mode"] else "") + (" tree" if r["tree"] else "")
                  + (" root/shared-first" if r["root_first"] else "") + (" split-tiles" if r["split_tiles"] else "")
                  + f": {r.get('registers')} regs, spill "
                  f"{r.get('spill_stores')}/"
                  f"{r.get('spill_loads')} B, smem {r['smem_bytes']} B"
                  + (f", ldmatrix mode {r['ldmatrix_addr32']}" if "ldmatrix_addr32" in r else "")
                  + (f", tile in {'smem' if r['tile_smem'] else 'registers'}" if "tile_smem" in r else "")
                  + (", wgmma SERIALIZED by ptxas" if r.get("wgmma_serialized") else ""))
    for err in failures:
        print(err, file=sys.stderr)
    ok = sum(r["ok"] for r in results)
    print(f"compiled {ok}/{len(results)} kernel specializations for {', '.join(args.arch or ARCHS)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0 if ok == len(results) else 1


def _dq_mode(spec) -> str:
    """The dK/dV kernel's dQ mode ("atomic", "ordered"), "" for the others."""
    return "ordered" if spec.dq_ordered else "atomic" if spec.dq_atomic else ""


subcommand("kernels", "compile every CUDA kernel specialization with NVRTC (no GPU needed)")((_args, _run))
