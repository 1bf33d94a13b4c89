"""`llama-npu hw-check` on hand-written AIR modules: exit codes, one line per violation, one clear line for
unreadable text (docs/hardware-model.md)."""
from __future__ import annotations

import pytest

from kernel_builder.hw import HwParseError, analyze_module
from llama_npu.cli import main as cli_main
from tests.hw_texts import herd_module, staged_gemm

def test_hw_check_cli_exit_codes_and_one_line_per_violation(tmp_path, capsys):
    good = tmp_path / "good.mlir"
    good.write_text(staged_gemm(drain=True))
    bad = tmp_path / "bad.mlir"
    bad.write_text(herd_module("""
          %out = memref.alloc() : memref<8x64xbf16, 2 : i32>
          %r = arith.muli %tx, %c8 : index
          %c_ = arith.muli %ty, %c64 : index
          air.dma_memcpy_nd (%a0[%r, %c_] [%c8, %c64] [%c256, %c1_], %out[] [] []) : (memref<64x256xbf16>, memref<8x64xbf16, 2 : i32>)""",
                               "memref<64x256xbf16>"))
    assert cli_main(["hw-check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "good" in out and " ok" in out
    assert cli_main(["hw-check", str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [ln for ln in out if ln.startswith("bad: launch 0")] == \
        [next(ln for ln in out if "shim S2MM channels 32/16" in ln)]
    garbage = tmp_path / "garbage.mlir"
    garbage.write_text("module { func.func @f( {")
    assert cli_main(["hw-check", str(garbage)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "garbage.mlir" in err and "Traceback" not in err
    assert cli_main(["hw-check", str(tmp_path / "missing.mlir")]) == 2


def test_unreadable_text_is_one_line_error():
    with pytest.raises(HwParseError, match="line"):
        analyze_module(herd_module("%z = memref.alloc(%c1_) : memref<?xbf16, 2 : i32>", "memref<64xbf16>"))
