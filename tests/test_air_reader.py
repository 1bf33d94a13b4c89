"""The one AIR reader (kernel_builder.air_module): a module's text is parsed once per process, whichever
consumers read it - the hardware model (the build's hw gate), the build key and preset, the mlir-opt check,
the launch program of `emu`, the AIR interpreter of `emu-interp` and the tests' structure checks - and a copy
of the text read back from disk finds the same tree."""
from __future__ import annotations

import collections

import air_checks
import numpy as np
import pytest

from kernel_builder import air_module, air_ops
from kernel_builder import mlir_text as mt
from llama_npu.models import llama as shapes
from llama_npu.models.llama import LlamaModel
from multi_launch_builder.compile import driver
from multi_launch_builder.devices.interp import InterpEmuDevice
from multi_launch_builder.emulator.air_interp import DTYPES
from multi_launch_builder.stitcher import stitch


@pytest.fixture
def counted(monkeypatch):
    """Counts of the reader's module parses and block splits, by text."""
    air_module.clear()
    parses, splits = collections.Counter(), collections.Counter()
    parse_module, iter_block = mt.parse_module, air_ops.iter_block

    def spy_parse(text):
        parses[text] += 1
        return parse_module(text)

    def spy_split(ctx, start, end):
        splits[(ctx.text, start, end)] += 1
        return iter_block(ctx, start, end)

    monkeypatch.setattr(mt, "parse_module", spy_parse)
    monkeypatch.setattr(air_ops, "iter_block", spy_split)
    return parses, splits


def test_smollm2_layer_is_parsed_once_by_every_consumer(counted, tmp_path):
    parses, splits = counted
    decl = next(d for d in LlamaModel(shapes.SMOLLM2_135M).modules((64,), 256) if d.name == "layer_kv256")
    # build: stitch, hw gate (hardware model), preset, key, mlir-opt check of the herd bodies
    art = driver.build_modules([decl], tmp_path, "emu", progress=False).artifacts[decl.name]
    text = stitch(decl)
    assert art.mlir.read_text() == text
    dev = InterpEmuDevice()
    handle = dev.load(art)                 # emu's launch program + the interpreter, each from a fresh read
    bufs = []
    for t in handle.interp.arg_types:
        b = dev.alloc(t.nbytes)
        dev.write(b, np.zeros(t.size, DTYPES[t.dtype]))
        bufs.append(b)
    dev.run(handle, bufs)
    assert dev.last_run_stats.calls > 0 and dev.last_run_stats.tiles > 0
    rep = air_checks.check_module(text)    # the tests' structure checks walk the same tree
    assert rep.errors == [] and len(rep.kernels) == len(decl.launches)
    assert air_module.parses(text) == 1
    assert parses[text] == 1, f"the layer module's text was parsed {parses[text]} times"
    again = [k for k, n in splits.items() if k[0] == text and n > 1]
    assert not again, f"{len(again)} blocks of the module were split more than once"
    assert sum(1 for k in splits if k[0] == text) > 10      # the tree was really read (launches, herds, loops)


def test_equal_text_finds_the_same_tree_and_errors_stay_one_line():
    air_module.clear()
    text = stitch(next(d for d in LlamaModel(shapes.SMOLLM2_135M).modules((64,), 256) if d.name == "ffn_s64"))
    copy = "".join([text[:10], text[10:]])
    assert copy is not text and air_module.read(copy) is air_module.read(text)
    tree = air_module.read(text)
    assert [op.name for op in tree.top_regions] == ["air.launch"] * len(tree.top_regions)
    assert tree.link_objects and all(o.endswith(".o") for o in tree.link_objects)
    assert tree.preset_flags is not None
    # a broken module: every consumer reports the reader's error in its own one-line error type
    from kernel_builder.hw import HwParseError, analyze_module
    from multi_launch_builder.emulator.air_interp import InterpError, compile_module
    broken = text.replace("air.launch", "air.launch (", 1)
    with pytest.raises(HwParseError):
        analyze_module(broken)
    with pytest.raises(InterpError):
        compile_module(broken)
    assert air_module.parses(broken) == 1


TREE_TEXT = """// aircc preset: --stack-size 1280
#map = affine_map<(d0) -> (d0)>
module {
  air.channel @ch [1, 1]
  func.func private @k(memref<8xbf16, 2 : i32>) attributes {link_with = "k.o", llvm.emit_c_interface}
  func.func @f(%arg0: memref<8xbf16>) {
    %c1 = arith.constant 1 : index
    air.launch (%lx) in (%lsx=%c1) args(%la=%arg0) : memref<8xbf16> attributes {llama_npu.kernel = {kind = "t"}} {
      air.segment @s args(%sa=%la) : memref<8xbf16> {
        %c1_0 = arith.constant 1 : index
        air.herd @h tile (%tx, %ty) in (%sx=%c1_0, %sy=%c1_0) args(%ha=%sa) : memref<8xbf16> {
          %c0 = arith.constant 0 : index
          %b = memref.alloc() : memref<8xbf16, 2 : i32>
          scf.for %i = %c0 to %c1_0 step %c1_0 {
            func.call @k(%b) : (memref<8xbf16, 2 : i32>) -> ()
          }
          linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%b : memref<8xbf16, 2 : i32>) outs(%b : memref<8xbf16, 2 : i32>) {
          ^bb0(%in: bf16, %out: bf16):
            %r = math.rsqrt %in : bf16
            linalg.yield %r : bf16
          }
        }
      }
    }
    return
  }
}
"""


def test_the_tree_of_a_small_module():
    air_module.clear()
    tree = air_module.read(TREE_TEXT)
    assert tree.func.name == "f" and tree.externals == {"k": "k.o"} and tree.link_objects == ("k.o",)
    assert tree.preset_flags == ("--stack-size", "1280") and set(tree.channels) == {"ch"}
    assert [op.name for op in tree.body] == ["arith.constant", "air.launch", "return"]
    launch = tree.top_regions[0]
    assert launch.air.attributes == {"llama_npu.kernel": {"kind": "t"}} and launch.air.args == (("la", "arg0"),)
    assert len(launch.air.text) < len(launch.full) // 4          # the header keeps only the header's text
    herd = launch.body[0].body[1]
    assert (herd.name, herd.air.symbol, herd.air.ids) == ("air.herd", "h", ("tx", "ty"))
    loop, generic = herd.body[2], herd.body[3]
    assert loop.head == "scf.for %i = %c0 to %c1_0 step %c1_0" and [o.name for o in loop.body] == ["func.call"]
    assert [o.name for o in generic.body] == ["math.rsqrt", "linalg.yield"] and generic.body[0].results == ["%r"]
    assert generic.block_label.group(1) == "%in: bf16, %out: bf16"
    assert generic.body[0].line == TREE_TEXT.splitlines().index("            %r = math.rsqrt %in : bf16") + 1
    assert tree.called_symbols == {"k"} and "math.rsqrt" in tree.result_op_names
    assert herd.body[1] is not herd.body[1] and herd.body[2].body is herd.body[2].body   # views; regions kept
    assert air_module.parses(TREE_TEXT) == 1
    # a text that is not one module: refused once, with the same message every time it is asked
    bad = TREE_TEXT.replace("module {", "module {{", 1)
    for _ in range(2):
        with pytest.raises(ValueError, match="unclosed|unbalanced"):
            air_module.read(bad).layout
    assert air_module.parses(bad) == 1


def test_the_cache_keeps_the_newest_texts(monkeypatch):
    air_module.clear()
    monkeypatch.setattr(air_module, "CACHE_SIZE", 2)
    texts = [TREE_TEXT.replace("@f(", f"@f{i}(") for i in range(3)]
    for t in texts + texts[2:]:
        assert air_module.read(t).func.name == t[t.index("func.func @") + 11:t.index("(%arg0")]
    assert [air_module.parses(t) for t in texts] == [1, 1, 1]
    air_module.read(texts[0]).layout                  # evicted (the oldest of three): read again
    assert air_module.parses(texts[0]) == 2 and air_module.parses(texts[2]) == 1
