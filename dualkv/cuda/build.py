"""Run-time compilation of the CUDA sources with NVRTC (cuda.core), cached on disk by content.

The cache key covers the source files (all of ``csrc/``), the options (macros, arch), and the NVRTC version; it
lives in ``$DUALKV_CACHE_DIR`` (default: cuda.core's per-user cache dir + ``/dualkv``). Entries are written
atomically (cuda.core's :class:`FileStreamProgramCache`), so several processes may compile at once.
``$DUALKV_NVRTC_LIB`` (a folder holding libnvrtc.so.* and its builtins) compiles with that NVRTC instead of the
installed one: at 255 registers ptxas's allocation of the mma.sync backward moved a lot between versions
(experiments/results/checks/s28spills-cpu-20261129.log). ``$DUALKV_BUILD_LOG`` (a file path) appends one JSON line per
specialization a process asks for: the spec, the NVRTC, whether the cache held it, a hash of the cubin, and for a fresh
compilation the macros kept and ptxas's spills; it tells which cubin a timing ran.
Compilation needs no GPU: CI builds every specialization for sm_80 and sm_90.
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import io
import json
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .configs import KernelSpec

if TYPE_CHECKING:
    from cuda.core import ProgramOptions

CSRC = Path(__file__).resolve().parent / "csrc"


class KernelBuildError(RuntimeError):
    """NVRTC rejected a kernel; the message carries its log."""


@dataclass
class BuiltKernel:
    spec: KernelSpec
    cubin: bytes
    log: str  # ptxas resource report when freshly compiled with -v (always for a compiler-chosen build), "" on a hit
    defines: tuple[tuple[str, str], ...] = ()  # the macros it was compiled with (the kept set's); () on a cache hit


@lru_cache(maxsize=1)
def _sources_digest() -> bytes:
    h = hashlib.sha256()
    for path in sorted(CSRC.glob("*.cu*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.digest()


@lru_cache(maxsize=1)
def cuda_include_dir() -> str:
    """Directory holding cuda_bf16.h / cuda_fp16.h (NVRTC ships none): the CUDA runtime headers wheel."""
    from cuda import pathfinder

    found = pathfinder.find_nvidia_header_directory("cudart")
    if not found:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root and (Path(root) / "include" / "cuda_bf16.h").exists():
                found = str(Path(root) / "include")
                break
    if not found:
        raise KernelBuildError("cannot find the CUDA runtime headers (cuda_bf16.h); install nvidia-cuda-runtime "
                               "(pip install 'cuda-toolkit[cudart]' or nvidia-cuda-runtime)")
    return str(found)


def cache_dir() -> Path:
    env = os.environ.get("DUALKV_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dualkv" / "kernels"


_cache_lock = threading.Lock()
_caches: dict[str, object] = {}


def _disk_cache():
    from cuda.core.utils import FileStreamProgramCache

    path = str(cache_dir())
    with _cache_lock:
        if path not in _caches:
            Path(path).mkdir(parents=True, exist_ok=True)
            _caches[path] = FileStreamProgramCache(path)
        return _caches[path]


def load_nvrtc(lib_dir: str) -> tuple[int, int]:
    """Load the NVRTC in ``lib_dir`` (libnvrtc.so.* and its libnvrtc-builtins.so.*, as the nvidia-cuda-nvrtc wheel
    lays them out) before cuda.bindings binds one, so that every compilation of this process uses it; returns its
    (major, minor). Raises :class:`KernelBuildError` if the folder holds none, or if another NVRTC is in use already
    (cuda.bindings binds the library once per process, at its first call)."""
    folder = Path(lib_dir).resolve()  # (a bare file name would send ctypes to the system's search path)
    libs = sorted(folder.glob("libnvrtc.so.*"))
    builtins = sorted(folder.glob("libnvrtc-builtins.so.*"))
    if not libs or not builtins:
        raise KernelBuildError(f"{lib_dir}: no libnvrtc.so.* with its libnvrtc-builtins.so.* there")
    try:
        for lib in (builtins[0], libs[0]):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise KernelBuildError(f"{lib_dir}: cannot load its NVRTC: {err}") from err
    from cuda.bindings import nvrtc  # (binds the library loaded above: it is found by its soname)

    _, major, minor = nvrtc.nvrtcVersion()
    wanted = ".".join(builtins[0].name.split(".so.", 1)[1].split(".")[:2])  # "13.0" (of 13.0, or 13.0.88)
    if f"{major}.{minor}" != wanted:
        raise KernelBuildError(f"{lib_dir}: NVRTC {major}.{minor} is in use in this process, not the {wanted} there "
                               "(it must be loaded before anything compiles)")
    return major, minor


_nvrtc_lock = threading.Lock()
_nvrtc_chosen: list[str] = []


def nvrtc_from_env() -> None:
    """Load ``$DUALKV_NVRTC_LIB``'s NVRTC once per process (:func:`load_nvrtc`), before the first compilation; nothing
    when it is unset or empty. Raises :class:`KernelBuildError` naming the variable."""
    lib_dir = os.environ.get("DUALKV_NVRTC_LIB")
    if not lib_dir:
        return
    with _nvrtc_lock:
        if _nvrtc_chosen and _nvrtc_chosen[0] == lib_dir:
            return
        if _nvrtc_chosen:
            raise KernelBuildError(f"DUALKV_NVRTC_LIB changed from {_nvrtc_chosen[0]} to {lib_dir} in one process")
        try:
            load_nvrtc(lib_dir)
        except KernelBuildError as err:
            raise KernelBuildError(f"DUALKV_NVRTC_LIB={err}") from err
        _nvrtc_chosen.append(lib_dir)


def nvrtc_version() -> str | None:
    """The NVRTC version this process compiles with ("13.0"; ``$DUALKV_NVRTC_LIB``'s when that is set, which this
    loads first), for records: None without cuda-bindings or an NVRTC, "unavailable: ..." when the variable's folder
    cannot serve (the first compilation raises on that)."""
    try:
        nvrtc_from_env()
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except ImportError:
        return None
    except KernelBuildError as err:
        return f"unavailable: {err}"
    except Exception:  # cuda-bindings without an NVRTC library (pathfinder finds none)
        return None
    return f"{major}.{minor}" if int(err) == 0 else None


def extra_defines() -> list[tuple[str, str]]:
    """Debug macros from ``$DUALKV_EXTRA_DEFINES`` ("NAME=VALUE,NAME2=VALUE2"): for bisecting a kernel on a GPU
    (they are part of the compile options, hence of the cache key)."""
    text = os.environ.get("DUALKV_EXTRA_DEFINES", "")
    return [tuple(item.split("=", 1)) if "=" in item else (item, "1") for item in text.split(",") if item]


class AddressingModes(NamedTuple):
    """DKV_DKDV_ADDR32 modes in order of preference from NVRTC release ``first`` on: for the ordered dQ builds and for
    the others; and the DKV_DKDV_SMEM32 bits every dK/dV build takes there (0: the source's pointer form)."""

    first: tuple[int, int]
    ordered: tuple[int, ...]
    other: tuple[int, ...]
    smem32: int = 0


#: The mma.sync dK/dV kernel's ldmatrix addressing (bwd_dkdv.cu's DKV_DKDV_ADDR32; common.cuh's DKV_LDSM_ADDR32) by the
#: NVRTC that compiles it, newest release first. 0 forms each address from a generic pointer, 1 from one 32-bit shared
#: address per operand plus compile-time offsets, 2 as 1 with the lane's coordinates re-read. NVRTC 12.8 to 13.0 turn
#: the pointer form into a 64-bit add and a truncation per ldmatrix, which ptxas does not fold into [R+imm]; 13.1 on
#: form it in 32 bits. At 255 registers ptxas's spills move between the modes build by build (e.g. 13.0's sm_80 d = 128
#: non-causal own-first ordered build spills 120 / 180 bytes in mode 2 and none in 1;
#: checks/s30addr32-nvrtc-cpu-20261129.log), so :func:`compile_spec` keeps the first mode that spills nothing, else
#: the one spilling least. H200, d = 128 dK/dV kernel at (16, 32K), ms: NVRTC 13.0 ordered 239.3 / 231.2 / 226.4
#: (modes 0 / 1 / 2; spill stores 60 / 36 / 4 bytes), atomic 221.2 / 221.9 (1) against 227.8 (2); NVRTC 13.5 ordered
#: 230.0 / 222.6 / 234.5 (spill stores 20 / 0 / 108) (checks/s30addr32-h200-20261129T1839Z.json).
#: Before 13.1 every dK/dV build also takes DKV_DKDV_SMEM32=7 (bwd_dkdv.cu: the main loop's shared addresses formed in
#: 32 bits from one conversion of the smem base, which 13.5 does itself) and then mode 0 first: NVRTC 13.0's sm_90
#: d = 128 ordered main loop 1306 SASS instructions without spills (13.5's default: 1307), against 1343 spilling 16 / 20
#: bytes before (checks/s39addr-cpu-20261130.log). H200, NVRTC 13.0, mma.sync backward ms at (8, 8K) / (16, 32K), two
#: rounds of alternating processes: ordered 27.11 / 227.74 and 27.08 / 227.47 before, 26.38 / 219.50 and 26.21 / 219.78
#: with 7 in mode 0 (26.66 / 222.92 and 26.47 / 223.63 in mode 2); atomic 26.83 / 215.80 and 26.83 / 215.62 before,
#: 26.21 / 211.06 and 26.12 / 210.91 with 7 in mode 0 (checks/s39addr-h200-20261130T2105Z.json). Under 13.5 the macro
#: made the ordered backward 1.5-2% slower (218.3-219.5 against 215.1 / 215.3 ms at (16, 32K): checks/s39n135-*).
DKDV_ADDR32_BY_NVRTC: tuple[AddressingModes, ...] = (AddressingModes((13, 1), (1, 0, 2), (1, 0, 2)),
                                                     AddressingModes((0, 0), (0, 1, 2), (0, 1, 2), smem32=7))
#: The macros that fix the dK/dV kernel's addressing when ``$DUALKV_EXTRA_DEFINES`` sets either.
ADDRESSING_MACROS = ("DKV_DKDV_ADDR32", "DKV_LDSM_ADDR32")
#: The dK/dV kernel's 32-bit shared addressing bits (bwd_dkdv.cu), set per NVRTC release (:class:`AddressingModes`)
#: unless ``$DUALKV_EXTRA_DEFINES`` sets it.
SMEM32_MACRO = "DKV_DKDV_SMEM32"

Macros = list[tuple[str, str]]


def dkdv_addressing(version: str | None) -> AddressingModes:
    """The mma.sync dK/dV kernel's addressing under NVRTC ``version`` ("13.0"; None, when unknown, as the oldest): the
    entry of the newest release in :data:`DKDV_ADDR32_BY_NVRTC` that is not newer."""
    try:
        release = tuple(int(part) for part in version.split(".")[:2]) if version else (0, 0)
    except ValueError:  # "unavailable: ..." (nvrtc_version); the compilation itself raises on that
        release = (0, 0)
    return next(entry for entry in DKDV_ADDR32_BY_NVRTC if release >= entry.first)


def dkdv_addr32_modes(version: str | None, dq_ordered: bool) -> tuple[int, ...]:
    """DKV_DKDV_ADDR32 modes, preferred first, for an mma.sync dK/dV build (``dq_ordered``: the ordered dQ mode's) under
    NVRTC ``version`` (:func:`dkdv_addressing`)."""
    modes = dkdv_addressing(version)
    return modes.ordered if dq_ordered else modes.other


#: The mma.sync forward's tile description in registers (0, preferred) or in shared memory (1): fwd.cu's
#: DKV_FWD_TILE_SMEM. 1 reloads the tile from smem and costs instructions: kept only where 0 spills more than
#: FWD_SPILL_TOLERANCE bytes (stores and loads). H200, d = 128 sm_90 causal pack 4 forward at (8, 8K) / (16, 32K), ms:
#: NVRTC 13.5, 0 spilling 152 / 168 bytes: 10.33 / 86.39 against 1 spilling none: 9.26 / 80.30 and 9.23 / 80.53; NVRTC
#: 13.0, both spilling 8 / 8: 0 9.41 / 80.54 and 9.44 / 81.07 against 1 9.73 / 84.85
#: (checks/s31fwd-h200-20261129T2134Z.json; every build's counts in checks/s31fwdtile-cpu-20261129.log). Since the
#: lazy rescale (softmax.cuh, s35) that build spills nothing with 0 under 13.5 either (a CPU test checks it), so 0 is
#: kept there too; the 13.5 build was not timed since.
FWD_TILE_SMEM_CHOICES = (0, 1)
FWD_SPILL_TOLERANCE = 16


#: The macro :func:`compiler_chosen_macros` chooses the value of, per kernel, and all of them (what
#: ``$DUALKV_BUILD_LOG`` records as kept).
CHOSEN_BY_KERNEL = {"bwd_dkdv": "DKV_DKDV_ADDR32", "fwd": "DKV_FWD_TILE_SMEM"}
CHOSEN_MACROS = tuple(CHOSEN_BY_KERNEL.values())
#: The macros ``$DUALKV_BUILD_LOG`` records as kept: the chosen ones and those set per NVRTC release.
RECORDED_MACROS = CHOSEN_MACROS + (SMEM32_MACRO,)
#: Names a compiler-chosen build's cache entry (with its candidates): changed when the choosing changed, so that no
#: cubin kept by an earlier rule is served. "choose2": the rule that asks NVRTC not to serve -v compilations from its
#: own cache (:func:`nvrtc_caches`); entries under "choose" may hold a build kept on a missing spill report.
CHOICE_KEY = "choose2:"


def compiler_chosen_macros(spec: KernelSpec, extra: Macros) -> list[Macros]:
    """The macro sets :func:`compile_spec` chooses among for ``spec``, preferred first (what the compiler decides rather
    than the kernel specification): DKV_DKDV_ADDR32's modes for bwd_dkdv builds (:func:`dkdv_addr32_modes`), each with
    the release's DKV_DKDV_SMEM32 where it is not 0, and DKV_FWD_TILE_SMEM's (:data:`FWD_TILE_SMEM_CHOICES`) for fwd
    builds, unless ``extra`` (``$DUALKV_EXTRA_DEFINES``) fixes the macro; one empty set otherwise."""
    fixed = {name for name, _ in extra}
    chosen = CHOSEN_BY_KERNEL.get(spec.kernel)
    if spec.kernel == "bwd_dkdv":
        version = nvrtc_version()
        bits = dkdv_addressing(version).smem32
        smem32 = [(SMEM32_MACRO, str(bits))] if bits and SMEM32_MACRO not in fixed else []
        if fixed & set(ADDRESSING_MACROS):
            return [smem32]
        return [[(chosen, str(mode))] + smem32 for mode in dkdv_addr32_modes(version, spec.dq_ordered)]
    if spec.kernel == "fwd" and chosen not in fixed:
        return [[(chosen, str(choice))] for choice in FWD_TILE_SMEM_CHOICES]
    return [[]]


#: Macros that fix a kernel's dQ order (and so must match the launcher's schedule) or its CTA order (part of the
#: specification, so that cached cubins and recorded settings name it): only the spec may set them.
SCHEDULE_MACROS = ("DKV_TREE", "DKV_TREE_ROOT_FIRST", "DKV_DQ_ORDERED", "DKV_DQ_ATOMIC", "DKV_HEAD_MAJOR",
                   "DKV_SPLIT_TILES")


def _options(spec: KernelSpec, verbose: bool, chosen: Macros, extra: Macros) -> "ProgramOptions":
    from cuda.core import ProgramOptions

    overridden = sorted({name for name, _ in extra} & set(SCHEDULE_MACROS))
    if overridden:
        raise ValueError(f"DUALKV_EXTRA_DEFINES sets {overridden}: these fix the kernels' dQ order (which must match "
                         "the launcher's schedule) or CTA order, so only the kernel specification sets them (for the "
                         "dQ orders use DUALKV_TREE_DQ_ORDER and DUALKV_TWO_LEVEL_DQ_ORDER, for the warp-specialised "
                         "backward's CTA order DUALKV_WS_CTA_ORDER)")
    bypass = {"no_cache": True} if verbose and _no_cache_option() and nvrtc_caches() else {}
    return ProgramOptions(name=f"dualkv_{spec.kernel}", arch=spec.arch, std="c++17",
                          include_path=[str(CSRC), cuda_include_dir()], define_macro=spec.defines() + chosen + extra,
                          ptxas_options=["-v"] if verbose else None, use_fast_math=False, **bypass)


@lru_cache(maxsize=1)
def _no_cache_option() -> bool:
    """Whether this cuda-core's ProgramOptions has ``no_cache`` (releases before it lack the field)."""
    from cuda.core import ProgramOptions

    return "no_cache" in inspect.signature(ProgramOptions).parameters


def nvrtc_caches() -> bool:
    """Whether this process's NVRTC may keep its own cache of compilations (12.9 and later do where a CUDA driver is
    present; a CPU-only machine sees no effect). A compilation it serves from there runs no ptxas, so its log has no
    ptxas -v report: a -v compilation therefore passes ``--no-cache`` (ProgramOptions.no_cache), or the spill-based
    choices of :func:`compile_spec` would read a missing report. On a GPU machine they did: a precompile after the
    same kernels had been compiled once kept NVRTC 13.0's spilling preferred dK/dV mode, 240.8 against 226.4 ms at
    (16, 32K) on an H200 (checks/s33cache-h200-20261130T0307Z.json)."""
    try:
        release = tuple(int(part) for part in (nvrtc_version() or "0.0").split(".")[:2])
    except ValueError:  # "unavailable: ..."
        return False
    return release >= (12, 9)


def spill_tolerance(spec: KernelSpec) -> int:
    """Spilled bytes (stores and loads) up to which :func:`compile_spec` keeps a build's preferred macro set: the
    forward's :data:`FWD_SPILL_TOLERANCE`, none elsewhere (part of the cache key)."""
    return FWD_SPILL_TOLERANCE if spec.kernel == "fwd" else 0


def compile_spec(spec: KernelSpec, *, use_cache: bool = True, verbose: bool = False) -> BuiltKernel:
    """Compile (or fetch from the disk cache) one specialization to a cubin (with ``$DUALKV_NVRTC_LIB``'s NVRTC when
    that is set). Where the compiler chooses among macro sets (:func:`compiler_chosen_macros`) they are compiled in
    turn, with ptxas -v, until one spills no more than :func:`spill_tolerance` bytes (stores and loads); else the one
    spilling the fewest is kept. A
    cold cache thus compiles such a build up to three times (before DKV_DKDV_SMEM32, NVRTC 13.0's sm_90 d = 128
    ordered dK/dV builds spilled a little in every mode). The cache holds the kept cubin under a key naming the candidates in order, not the one kept;
    a set that fails to compile raises, naming its macros."""
    nvrtc_from_env()
    from cuda.core.utils import make_program_cache_key

    source = (CSRC / spec.source).read_text()
    extra = extra_defines()
    candidates = compiler_chosen_macros(spec, extra)
    tolerance = spill_tolerance(spec)
    if len(candidates) > 1:  # e.g. DKV_DKDV_ADDR32=choose2:1,0,2, DKV_FWD_TILE_SMEM=choose2:0,1@16; with more
        # macros per candidate, every value: DKV_DKDV_ADDR32=choose2:0+7,1+7,2+7
        keyed = [(candidates[0][0][0], CHOICE_KEY + ",".join("+".join(value for _, value in macros)
                                                             for macros in candidates) +
                  (f"@{tolerance}" if tolerance else ""))]
    else:
        keyed = candidates[0]
    key = make_program_cache_key(code=source, code_type="c++", options=_options(spec, verbose, keyed, extra),
                                 target_type="cubin", extra_digest=_sources_digest())
    cache = _disk_cache() if use_cache else None
    if cache is not None and not verbose:
        hit = cache.get(key)
        if hit is not None:
            return _logged(BuiltKernel(spec, bytes(hit), ""), hit=True)
    if len(candidates) > 1:
        built = _least_spilling(spec, source, candidates, extra, tolerance)
    else:
        built = _compile(spec, source, _options(spec, verbose, candidates[0], extra))
    if cache is not None:
        cache[key] = built.cubin
    return _logged(built, hit=False, extra=extra)


_build_log_lock = threading.Lock()


def _logged(built: BuiltKernel, *, hit: bool, extra: Macros = ()) -> BuiltKernel:
    """``built``, after appending its JSON line to ``$DUALKV_BUILD_LOG`` when that is set (see the module's text);
    ``extra``: the ``$DUALKV_EXTRA_DEFINES`` it was compiled with (logged with the compiler-chosen macros)."""
    path = os.environ.get("DUALKV_BUILD_LOG")
    if path:
        record = {"spec": repr(built.spec), "nvrtc": nvrtc_version(), "cache_hit": hit,
                  "cubin_sha256": hashlib.sha256(built.cubin).hexdigest()[:16], "pid": os.getpid()}
        if not hit:
            macros = {name for name, _ in extra} | set(RECORDED_MACROS)
            record["kept_macros"] = {name: value for name, value in built.defines if name in macros}
            record.update({k: v for k, v in resource_usage(built.log).items() if k.startswith("spill")})
        with _build_log_lock, open(path, "a") as log:
            log.write(json.dumps(record) + "\n")
    return built


def _least_spilling(spec: KernelSpec, source: str, candidates: list[Macros], extra: Macros,
                    tolerance: int = 0) -> BuiltKernel:
    """The first of ``candidates`` (macro sets, preferred first) that ptxas compiles spilling at most ``tolerance``
    bytes, else the one spilling the fewest bytes (ties to the preferred)."""
    best, best_spilled = None, 0
    for chosen in candidates:
        built = _compile(spec, source, _options(spec, True, chosen, extra))
        usage = resource_usage(built.log)
        if "spill_stores" not in usage:  # never read a missing report as "spills nothing"
            raise KernelBuildError(f"ptxas -v reported no spills for {spec} (macros {chosen}), so the build to keep "
                                   f"cannot be chosen; its log: {built.log!r}")
        spilled = usage["spill_stores"] + usage["spill_loads"]
        if best is None or spilled < best_spilled:
            best, best_spilled = built, spilled
        if spilled <= tolerance:
            break
    return best


def _compile(spec: KernelSpec, source: str, options: "ProgramOptions") -> BuiltKernel:
    from cuda.core import Program

    log = io.StringIO()
    try:
        obj = Program(source, code_type="c++", options=options).compile("cubin", logs=log)
    except Exception as err:  # NVRTC errors come back as cuda.core exceptions carrying the log
        raise KernelBuildError(f"NVRTC failed for {spec} (macros {list(options.define_macro or ())}):\n{err}\n"
                               f"{log.getvalue()}") from err
    return BuiltKernel(spec, bytes(obj.code), log.getvalue(), tuple(options.define_macro or ()))


def resource_usage(log: str) -> dict:
    """Registers, spills and stack frame parsed from a ptxas -v log, and ``wgmma_serialized``: whether ptxas
    serialized the kernel's wgmma instructions: any note saying "wgmma.mma_async instructions are serialized", whatever
    its code and reason (C7515 / C7514: non-wgmma code defines / reads an accumulator mid-pipeline; C7512: too
    few registers). The kernel stays correct, but every warpgroup MMA then waits for the one before it."""
    import re

    out = {"wgmma_serialized": "wgmma.mma_async instructions are serialized" in log}
    if m := re.search(r"Used (\d+) registers", log):
        out["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["stack"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out
