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
