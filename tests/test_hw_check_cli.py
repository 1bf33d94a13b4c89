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


def test_non_utf8_and_oversized_files_are_one_line(tmp_path, capsys):
    bad = tmp_path / "latin1.mlir"
    bad.write_bytes(b"module {\n// caf\xe9\n}\n")
    assert cli_main(["hw-check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not UTF-8 text (byte 0xe9 at offset 15, line 2)" in err, err
    big = tmp_path / "big.mlir"
    big.write_text(staged_gemm(drain=True) + "// " + "x" * 300_000 + "\n")
    assert cli_main(["hw-check", "--max-mib", "0.25", str(big)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over the 0.25 MiB limit for a module file" in err, err


def _dense_module(n_ops: int) -> str:
    """A valid herd whose body is 2*n_ops small index ops and one DMA: the most ops per byte a module has."""
    ops = "\n          ".join(f"%r{i} = arith.muli %tx, %c8 : index\n          %q{i} = arith.addi %r{i}, %c64 : index"
                              for i in range(n_ops))
    return herd_module(ops + """
          %out = memref.alloc() : memref<8x64xbf16, 2 : i32>
          air.dma_memcpy_nd (%out[] [] [], %a0[%c0, %c0] [%c8, %c64] [%c256, %c1_]) : (memref<8x64xbf16, 2 : i32>, memref<64x256xbf16>)""",
                       "memref<64x256xbf16>")


def _measure(text: str, traced: bool) -> tuple[float, float]:
    import time
    import tracemalloc

    from kernel_builder import air_module

    air_module.clear()   # measure the reading too: a cached tree would make the repeats cheaper than the first
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    rep = analyze_module(text, "big")
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    assert rep.ok and len(rep.launches) == 1
    return dt, peak / len(text)


def test_large_module_time_and_memory_are_linear():
    """Peak Python memory < 10x the module text (it was ~21x; a module followed by more text, 46x), and time
    linear in the size: a 2 MB module takes about 4x a 0.5 MB one (bounds generous for a loaded CI machine)."""
    small, large = _dense_module(5_000), _dense_module(20_000)
    assert len(large) > 1.9e6
    _, ratio = _measure(small, traced=True)
    assert ratio < 10, f"peak memory {ratio:.1f}x the module text"
    t_small = min(_measure(small, traced=False)[0] for _ in range(2))
    t_large, _ = _measure(large, traced=False)
    assert t_large < 12 * max(t_small, 0.05), (t_small, t_large)   # linear: ~4x; quadratic would be 16x
    assert t_large / (len(large) / 2**20) < 10, f"{t_large:.1f} s for {len(large) / 2**20:.1f} MiB"


def test_text_after_the_module_is_refused_without_lexing_it():
    import time

    text = staged_gemm(drain=True)
    t0 = time.perf_counter()
    with pytest.raises(HwParseError, match="unexpected text after the module"):
        analyze_module(text + text * 40)
    assert time.perf_counter() - t0 < 2
