"""The STATE contract: a persistent per-bo_key buffer written in place by one module at a scalar row offset
and read by a later module, on emu, emu-interp and null, with exact byte counters and hazard checks."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from multi_launch_builder.compile import build_modules
from multi_launch_builder.executor import ModuleExecutor
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.devices.emu import EmuDevice
from multi_launch_builder.devices.interp import InterpEmuDevice
from multi_launch_builder.devices.null import NullDevice
from kernel_builder.add import builder as add
from kernel_builder.rmsnorm import builder as rmsnorm
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.reference import KERNELS

D, ROWS, CAP = 64, 2, 8


def _append() -> ModuleDecl:
    """x + r written into rows [pos, pos + ROWS) of state `cache` (an in-place append at a scalar offset)."""
    return ModuleDecl("append", (
        Arg("x", (ROWS, D), Role.INPUT), Arg("r", (ROWS, D), Role.INPUT),
        Arg("slot", (ROWS, D), Role.STATE, state="cache", at="pos")),
        (Launch("add", partial(add.build, ROWS, D), ("x", "r", "slot")),), scalars=("pos",))


def _readback() -> ModuleDecl:
    """rmsnorm over the whole state (a window of CAP rows from row 0) -> an output."""
    return ModuleDecl("readback", (
        Arg("all", (CAP, D), Role.STATE, state="cache"), Arg("w", (D,), Role.STATIC),
        Arg("y", (CAP, D), Role.OUTPUT)),
        (Launch("norm", partial(rmsnorm.build, CAP, D, 1e-5), ("all", "w", "y")),))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    decls = [_append(), _readback()]
    return build_modules(decls, tmp_path_factory.mktemp("state"), "emu", progress=False).artifacts, decls


def _rand(rng, shape):
    return to_bf16(rng.standard_normal(shape))


@pytest.mark.parametrize("device", [EmuDevice, InterpEmuDevice, NullDevice])
def test_state_written_in_place_then_read_by_another_module(artifacts, device):
    arts, decls = artifacts
    kc = ModuleExecutor(device(), arts, decls)
    kc.define_state("cache", CAP)
    rng = np.random.default_rng(0)
    w = _rand(rng, (D,))
    expected = np.zeros((CAP, D), np.float32)
    for bo, base in (("L0", 0), ("L1", 100)):
        for pos in (0, 2, 6):   # three appends at scalar row offsets
            x, r = _rand(rng, (ROWS, D)), _rand(rng, (ROWS, D))
            out = kc.load_and_run("append", x=x, r=r, pos=pos, bo_key=bo)
            assert out == {}                                     # a state is never read back implicitly
            if bo == "L0":
                expected[pos:pos + ROWS] = KERNELS["add"](x, r, rows=ROWS, dim=D).astype(np.float32)
    c = kc.counters["append"]
    assert (c.calls, c.bytes_written, c.bytes_read) == (6, 6 * 2 * ROWS * D * 2, 0)   # x and r only
    y = kc.load_and_run("readback", w=w, bo_key="L0")["y"]
    assert kc.counters["readback"].bytes_written == D * 2 and kc.counters["readback"].bytes_read == CAP * D * 2
    if device is not NullDevice:
        want = KERNELS["rmsnorm"](to_bf16(expected), w, rows=CAP, dim=D, eps=1e-5)
        assert np.abs(y.astype(np.float32) - want.astype(np.float32)).max() <= 2 ** -6
        # rows the appends never touched are still zero; the other bo_key has its own buffer
        np.testing.assert_array_equal(kc.read_state("cache", "L0", 4, 6).astype(np.float32), 0)
        np.testing.assert_array_equal(kc.read_state("cache", "L0", 2, 4).astype(np.float32), expected[2:4])
    assert kc.memory_report()["state_bytes"] == 2 * CAP * D * 2


def test_window_outside_the_state_and_missing_scalar_are_rejected(artifacts):
    arts, decls = artifacts
    kc = ModuleExecutor(NullDevice(), arts, decls)
    x = np.zeros((ROWS, D), BF16)
    with pytest.raises(ValueError, match="state 'cache' has no capacity yet"):
        kc.load_and_run("append", x=x, r=x, pos=0)
    kc.define_state("cache", CAP)
    with pytest.raises(ValueError, match=r"window rows \[7, 9\) of state 'cache' are outside its 8 rows"):
        kc.load_and_run("append", x=x, r=x, pos=7)
    with pytest.raises(ValueError, match="scalar 'pos' missing"):
        kc.load_and_run("append", x=x, r=x)
    with pytest.raises(ValueError, match="scalar pos: expected an int"):
        kc.load_and_run("append", x=x, r=x, pos=1.5)
    with pytest.raises(ValueError, match="role state is never written by the host"):
        kc.load_and_run("append", x=x, r=x, slot=x, pos=0)
    assert kc.counters == {}


def test_growing_a_state_keeps_its_rows(artifacts):
    arts, decls = artifacts
    kc = ModuleExecutor(EmuDevice(), arts, decls)
    kc.define_state("cache", 4)
    rng = np.random.default_rng(1)
    x, r = _rand(rng, (ROWS, D)), _rand(rng, (ROWS, D))
    kc.load_and_run("append", x=x, r=r, pos=2, bo_key="L0")
    before = kc.read_state("cache", "L0")
    kc.define_state("cache", CAP)
    after = kc.read_state("cache", "L0")
    assert after.shape == (CAP, D)
    np.testing.assert_array_equal(after[:4].view(np.uint16), before.view(np.uint16))
    kc.load_and_run("append", x=x, r=r, pos=6, bo_key="L0")   # the new rows are usable
    np.testing.assert_array_equal(kc.read_state("cache", "L0", 6, 8).view(np.uint16),
                                  before[2:4].view(np.uint16))


def test_write_state_rows_and_errors(artifacts):
    arts, decls = artifacts
    kc = ModuleExecutor(EmuDevice(), arts, decls)
    kc.define_state("cache", CAP, per_key=False)
    rows = to_bf16(np.arange(3 * D).reshape(3, D))
    kc.write_state("cache", rows, start=4)
    np.testing.assert_array_equal(kc.read_state("cache", None, 4, 7).view(np.uint16), rows.view(np.uint16))
    assert kc.counters["state:cache"].bytes_written == 3 * D * 2
    with pytest.raises(ValueError, match=r"rows \[7, 10\) outside"):
        kc.write_state("cache", rows, start=7)
    with pytest.raises(ValueError, match="rows of"):
        kc.write_state("cache", rows.astype(np.float32))


def test_host_handoff_policy_copies_through_the_host_with_the_same_result(tmp_path):
    """handoff="host": a ref is read back and written into the consumer's own buffer (counted), with
    bit-identical results to the device hand-off."""
    from tests.small_decls import add_norm
    decls = [add_norm()]
    arts = build_modules(decls, tmp_path, "emu", progress=False).artifacts
    rng = np.random.default_rng(2)
    x, r, w = _rand(rng, (4, 64)), _rand(rng, (4, 64)), _rand(rng, (64,))
    outs, counts = [], []
    for policy in ("device", "host"):
        kc = ModuleExecutor(EmuDevice(), arts, decls, handoff=policy)
        kc.load_and_run("add_norm", x, r, w, read=())
        kc.reset_counters()
        outs.append(kc.load_and_run("add_norm", kc.ref("add_norm", "y"), r)["y"])
        c = kc.counters["add_norm"]
        counts.append((c.bytes_written, c.bytes_read))
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    y_bytes = 4 * 64 * 2
    assert counts == [(y_bytes, y_bytes), (2 * y_bytes, 2 * y_bytes)]
    with pytest.raises(ValueError, match="handoff must be one of"):
        ModuleExecutor(EmuDevice(), arts, decls, handoff="pcie")


def test_a_ref_may_start_at_a_row(tmp_path):
    """ref(module, arg, row=r) binds the rows from r on (the last prompt row feeding the LM head)."""
    from tests.small_decls import add_norm
    big = add_norm("big")
    one = ModuleDecl("one", (Arg("x", (1, 64), Role.INPUT), Arg("r", (1, 64), Role.INPUT),
                             Arg("y", (1, 64), Role.OUTPUT)),
                     (Launch("add", partial(add.build, 1, 64), ("x", "r", "y")),))
    decls = [big, one]
    arts = build_modules(decls, tmp_path, "emu", progress=False).artifacts
    kc = ModuleExecutor(EmuDevice(), arts, decls)
    rng = np.random.default_rng(3)
    x, r, w = _rand(rng, (4, 64)), _rand(rng, (4, 64)), _rand(rng, (64,))
    y = kc.load_and_run("big", x, r, w)["y"]
    zero = np.zeros((1, 64), BF16)
    got = kc.load_and_run("one", x=kc.ref("big", "y", row=3), r=zero)["y"]
    np.testing.assert_array_equal(got.view(np.uint16), y[3:4].view(np.uint16))
    with pytest.raises(ValueError, match="does not leave"):
        kc.load_and_run("one", x=kc.ref("big", "y", row=4), r=zero)


def test_host_attention_fallback_matches_the_attention_reference(tmp_path):
    """The CPU decode attention (f32 mirrors of the device KV cache) against reference.decode_attn (= the row
    of causal attention the emulated NPU computes): the same bytes; a 2 % scaling error would not pass."""
    from kernel_builder.reference import decode_attn
    from llama_npu.host_attention import HostAttention

    heads, kv_heads, hd, n_pos = 6, 2, 64, 40
    width = kv_heads * hd
    decl = ModuleDecl("kv_fill", (
        Arg("x", (1, width), Role.INPUT), Arg("r", (1, width), Role.INPUT),
        Arg("k_slot", (1, width), Role.STATE, state="k_cache", at="pos"),
        Arg("y", (1, width), Role.INPUT), Arg("z", (1, width), Role.INPUT),
        Arg("v_slot", (1, width), Role.STATE, state="v_cache", at="pos")),
        (Launch("k", partial(add.build, 1, width), ("x", "r", "k_slot")),
         Launch("v", partial(add.build, 1, width), ("y", "z", "v_slot"))), scalars=("pos",))
    arts = build_modules([decl], tmp_path, "emu", progress=False).artifacts
    kc = ModuleExecutor(EmuDevice(), arts, [decl])
    kc.define_state("k_cache", 64)
    kc.define_state("v_cache", 64)
    rng = np.random.default_rng(7)
    zero = np.zeros((1, width), BF16)
    for p in range(n_pos):
        kc.load_and_run("kv_fill", x=_rand(rng, (1, width)), r=zero, y=_rand(rng, (1, width)), z=zero, pos=p,
                        bo_key="L0")
    k_all, v_all = kc.read_state("k_cache", "L0"), kc.read_state("v_cache", "L0")
    host = HostAttention(1, heads, kv_heads, hd)
    for p in (0, 1, 20, n_pos - 1):
        q = _rand(rng, (1, heads * hd))
        got = host.attend(kc, 0, p, q)
        want = decode_attn(q, k_all, v_all, p, kv_rows=64, heads=heads, kv_heads=kv_heads, head_dim=hd)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        off = (got.astype(np.float32) * 1.02).astype(got.dtype)
        assert not np.array_equal(off.view(np.uint16), want.view(np.uint16))   # the check can fail
