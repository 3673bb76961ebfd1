"""experiments/sass_loop.py's disassembly parsing (no nvdisasm needed: canned disassemblies in both formats)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("sass_loop", Path(__file__).parents[1] / "experiments" / "sass_loop.py")
sass_loop = importlib.util.module_from_spec(_SPEC)
sys.modules["sass_loop"] = sass_loop  # its dataclass looks its module up
_SPEC.loader.exec_module(sass_loop)

# nvdisasm -c: labels. Instructions 0-1 before the loop; the loop is [2, 8] (7 instructions) with a forward branch at 4
# skipping 2 (5, 6), and one spill store and load.
NVDISASM = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   MOV R2, RZ ;
.L_x_0:
        /*0020*/                   LDSM.16.M88.4 R4, [R2+0x100] ;
        /*0030*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0040*/              @!P0 BRA `(.L_x_1) ;
        /*0050*/                   STL [R1], R8 ;
        /*0060*/                   MUFU.EX2 R9, R9 ;
.L_x_1:
        /*0070*/                   LDL R8, [R1] ;
        /*0080*/               @P1 BRA `(.L_x_0) ;
        /*0090*/                   EXIT ;
"""
# cuobjdump -sass: addresses as targets (and encoding lines between), an outer loop around an inner one.
CUOBJDUMP = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                /* 0x00000a00ff017b82 */
                                                                          /* 0x000e700000000800 */
        /*0010*/                   HMMA.16816.F32 R8, R4, R6, R8 ;       /* 0x0 */
        /*0020*/                   HMMA.16816.F32 R8, R4, R6, R8 ;       /* 0x0 */
        /*0030*/               @P0 BRA 0x10 ;                            /* 0x0 */
        /*0040*/                   IMAD R0, R0, 0x2, RZ ;                /* 0x0 */
        /*0050*/               @P1 BRA 0x0 ;                             /* 0x0 */
        /*0060*/                   EXIT ;                                /* 0x0 */
"""


def test_nvdisasm_loop_classes_branches_and_spills():
    stats = sass_loop.main_loop(NVDISASM)
    assert (stats.instructions, stats.start, stats.end, stats.length) == (10, 2, 8, 7)
    assert stats.classes == {"LDSM": 1, "HMMA": 1, "BRA": 2, "STL": 1, "MUFU": 1, "LDL": 1}
    assert stats.branches == [(4, 7, 2)]
    assert stats.spill_instructions == 2


def test_cuobjdump_addresses_and_loop_rank():
    outer, inner = sass_loop.main_loop(CUOBJDUMP), sass_loop.main_loop(CUOBJDUMP, rank=1)
    assert (outer.start, outer.end, outer.length) == (0, 5, 6)
    assert (inner.start, inner.end, inner.length, inner.classes["HMMA"]) == (1, 3, 3, 2)
    with pytest.raises(ValueError, match="no loop of rank 2"):
        sass_loop.main_loop(CUOBJDUMP, rank=2)


def test_forward_branches_alone_are_no_loop():
    straight = "\n".join(line for line in NVDISASM.splitlines() if "@P1 BRA" not in line)
    with pytest.raises(ValueError, match="no loop"):
        sass_loop.main_loop(straight)


def test_predicated_opcode_class():
    assert sass_loop.opcode_class("@!P0 LDSM.16.M88.4 R4, [R2]") == "LDSM"
    assert sass_loop.opcode_class("HMMA.16816.F32.BF16 R8, R4, R6, R8") == "HMMA"
