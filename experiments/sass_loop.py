"""Static SASS statistics of one kernel build's main loop, on a machine without a GPU.

Compiles one specialization (with the installed NVRTC, or ``$DUALKV_NVRTC_LIB``'s, and ``$DUALKV_EXTRA_DEFINES``),
disassembles it with nvdisasm (``--nvdisasm``, ``$NVDISASM`` or PATH; e.g. from the ``nvidia-cuda-nvdisasm`` wheel) and
prints ptxas's registers and spills, the kernel's instruction count, its main loop (the longest backward branch: every
path of its body counts), the loop's instruction classes and the branches inside it with what each skips. Counts, not
times: compare builds, NVRTC versions or tree states, then time the candidates on a GPU.

    python experiments/sass_loop.py "dkdv_spec(128, bf16, False, 'sm_90', dq_ordered=True, root_first=True)"
    DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=2 python experiments/sass_loop.py \
        "dkdv_spec(128, bf16, False, 'sm_80', dq_atomic=True, kernel='bwd_dkdv')"

``--sass FILE`` reads a disassembly of one function instead (nvdisasm -c, or cuobjdump -sass -fun NAME output, e.g. of
another library's kernel: addresses restart at each function, so a file of several would mix their branch targets);
``--loop 1`` takes the second-longest loop (where an outer loop wraps the main one). The branches listed are the
loop's forward branches (some may leave it) with the instructions each jumps over.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*?(?:`\((\.L_x_\d+)\)|0x([0-9a-f]+))")
_SPILLS = ("LDL", "STL")


@dataclass
class LoopStats:
    """A disassembly's instruction count and its main loop: [start, end] instruction indices, its length, the count of
    each opcode class (the mnemonic before the first dot) and, per branch inside it, (index, target, instructions
    skipped forward)."""

    instructions: int
    start: int
    end: int
    length: int
    classes: dict[str, int]
    branches: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def spill_instructions(self) -> int:
        return sum(self.classes.get(name, 0) for name in _SPILLS)


def opcode_class(instruction: str) -> str:
    """``@!P0 LDSM.16.M88.4 R4, [R2]`` -> ``LDSM``."""
    words = instruction.split()
    mnemonic = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return mnemonic.split(".")[0]


def parse_sass(text: str) -> tuple[list[str], list[int | None]]:
    """The instructions of a disassembly and each one's branch target (an instruction index; None when it is not a
    branch or its target is not found). Reads nvdisasm's labels (``.L_x_N``) and cuobjdump's addresses (``0x...``)."""
    instructions, addresses, labels, targets = [], [], {}, []
    for line in text.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        found = _INSTRUCTION.search(line)
        if found and found.group(2).strip():
            addresses.append(int(found.group(1), 16))
            instructions.append(found.group(2).strip())
    at_address = {address: i for i, address in enumerate(addresses)}
    for instruction in instructions:
        branch = _BRANCH.search(instruction)
        if branch is None:
            targets.append(None)
        elif branch.group(1):
            targets.append(labels.get(branch.group(1)))
        else:
            targets.append(at_address.get(int(branch.group(2), 16)))
    return instructions, targets


def main_loop(text: str, rank: int = 0) -> LoopStats:
    """The longest loop (backward branch) of a disassembly, or with ``rank`` k the (k+1)-th longest (an inner loop
    where an outer one wraps the whole kernel); raises ValueError when there is no such loop."""
    instructions, targets = parse_sass(text)
    loops = sorted(((target, i) for i, target in enumerate(targets) if target is not None and target < i),
                   key=lambda loop: loop[0] - loop[1])
    if len(loops) <= rank:
        raise ValueError(f"the disassembly has {len(loops)} loops (backward branches), no loop of rank {rank}")
    start, end = loops[rank]
    body = instructions[start:end + 1]
    branches = [(i, targets[i], targets[i] - i - 1) for i in range(start, end)
                if targets[i] is not None and targets[i] > i]
    return LoopStats(len(instructions), start, end, len(body), dict(collections.Counter(map(opcode_class, body))),
                     branches)


def find_nvdisasm(given: str | None) -> str:
    path = given or os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not path or not Path(path).exists():
        raise SystemExit("nvdisasm not found: pass --nvdisasm PATH or set NVDISASM (pip download nvidia-cuda-nvdisasm "
                         "and unpack it)")
    return path


def compile_and_disassemble(expression: str, nvdisasm: str) -> tuple[dict, str]:
    """(ptxas's resource report, the disassembly) of the spec ``expression`` names (evaluated with configs' names,
    ``torch``, ``bf16`` and ``fp16`` in scope)."""
    import torch

    from dualkv.cuda import configs
    from dualkv.cuda.build import compile_spec, resource_usage

    scope = {name: getattr(configs, name) for name in dir(configs) if not name.startswith("_")}
    scope.update(torch=torch, bf16=torch.bfloat16, fp16=torch.float16)
    spec = eval(expression, scope)  # a developer's tool: the expression is the command line's
    built = compile_spec(spec, use_cache=False, verbose=True)
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(built.cubin)
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return resource_usage(built.log), sass


def report(stats: LoopStats, resources: dict | None) -> str:
    lines = []
    if resources:
        lines.append(f"registers {resources['registers']}, spills {resources['spill_stores']} / "
                     f"{resources['spill_loads']} B (stores / loads), stack {resources['stack']} B")
    lines.append(f"{stats.instructions} instructions; main loop [{stats.start}, {stats.end}]: {stats.length}, "
                 f"{stats.spill_instructions} spill instructions")
    top = sorted(stats.classes.items(), key=lambda kv: -kv[1])
    lines.append("  " + "  ".join(f"{name} {count}" for name, count in top))
    for at, target, skipped in stats.branches:
        lines.append(f"  branch at {at} -> {target}: skips {skipped}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", nargs="?", help="a KernelSpec expression, e.g. \"fwd_spec(128, bf16, 4, False, 'sm_80')\"")
    parser.add_argument("--sass", help="read this disassembly instead of compiling")
    parser.add_argument("--nvdisasm", help="nvdisasm to use (default: $NVDISASM, then PATH)")
    parser.add_argument("--loop", type=int, default=0, help="the loop's rank by length (0: the longest)")
    parser.add_argument("--json", help="write the statistics here")
    args = parser.parse_args(argv)
    if bool(args.spec) == bool(args.sass):
        parser.error("give a spec expression or --sass FILE")
    if args.sass:
        resources, text = None, Path(args.sass).read_text()
    else:
        resources, text = compile_and_disassemble(args.spec, find_nvdisasm(args.nvdisasm))
    stats = main_loop(text, args.loop)
    print(report(stats, resources))
    if args.json:
        Path(args.json).write_text(json.dumps({"resources": resources, **asdict(stats),
                                               "spill_instructions": stats.spill_instructions}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
