"""ModuleExecutor contract on the emu device (real stitched text, numpy references) and on null."""
from __future__ import annotations

import numpy as np
import pytest

from multi_launch_builder.compile import build_modules
from multi_launch_builder.executor import ModuleExecutor
from multi_launch_builder.devices.emu import EmuDevice
from multi_launch_builder.devices.null import NullDevice
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.reference import KERNELS
from multi_launch_builder.decl import Role
from llama_npu.models.llama import LlamaModel, ModelShapes
from tests.small_decls import D, R, add_norm, gemv_mod


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("kc")
    decls = [add_norm(), gemv_mod()]
    build_modules(decls, cache_dir, "emu", progress=False)
    return cache_dir, decls


def _rand(rng, shape):
    return to_bf16(rng.standard_normal(shape))


def _expected_add_norm(x, r, w):
    return KERNELS["rmsnorm"](KERNELS["add"](x, r, rows=R, dim=D), w, rows=R, dim=D, eps=1e-5)


def test_results_match_references_and_intermediate_stays_on_device(built):
    cache_dir, decls = built
    kc = ModuleExecutor(EmuDevice(), cache_dir, decls)
    rng = np.random.default_rng(1)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    out = kc.load_and_run("add_norm", x, r, w)
    assert set(out) == {"y"}  # only OUTPUT args are read back
    assert out["y"].dtype == BF16
    np.testing.assert_array_equal(out["y"].view(np.uint16), _expected_add_norm(x, r, w).view(np.uint16))
    c = kc.counters["add_norm"]
    assert c.bytes_read == R * D * 2                      # y only, never the intermediate s
    assert c.bytes_written == 2 * R * D * 2 + D * 2        # x, r, w on the first call


def test_after_preload_a_call_writes_only_inputs(built):
    cache_dir, decls = built
    kc = ModuleExecutor(EmuDevice(), cache_dir, decls)
    rng = np.random.default_rng(2)
    w = _rand(rng, (64, 64))
    kc.preload("lm_head_gemv_t", w=w)
    assert kc.counters["lm_head_gemv_t"].bytes_written == 64 * 64 * 2
    kc.reset_counters()
    x = _rand(rng, (1, 64))
    out = kc.load_and_run("lm_head_gemv_t", None, x)         # static slot None after preload
    c = kc.counters["lm_head_gemv_t"]
    assert (c.calls, c.bytes_written, c.static_bytes_written, c.bytes_read) == (1, 64 * 2, 0, 64 * 2)
    exp = KERNELS["gemv"](w, x.reshape(64), m=64, k=64).reshape(1, 64)
    np.testing.assert_array_equal(out["y"].view(np.uint16), exp.view(np.uint16))
    # a static passed again on a later call is not re-sent
    kc.load_and_run("lm_head_gemv_t", w=w, x=x)
    assert kc.counters["lm_head_gemv_t"].bytes_written == 2 * 64 * 2


def test_bo_keys_keep_weights_apart(built):
    cache_dir, decls = built
    kc = ModuleExecutor(EmuDevice(), cache_dir, decls)
    rng = np.random.default_rng(3)
    wa, wb = _rand(rng, (D,)), _rand(rng, (D,)) * to_bf16(3.0)
    x, r = _rand(rng, (R, D)), _rand(rng, (R, D))
    ya = kc.load_and_run("add_norm", x, r, wa, bo_key="L0")["y"]
    yb = kc.load_and_run("add_norm", x, r, wb, bo_key="L1")["y"]
    assert not np.array_equal(ya, yb)
    ya2 = kc.load_and_run("add_norm", x, r, None, bo_key="L0")["y"]   # still layer 0's weights
    np.testing.assert_array_equal(ya2.view(np.uint16), _expected_add_norm(x, r, wa).view(np.uint16))
    assert sorted(kc.bo_keys("add_norm")) == ["L0", "L1"]
    assert kc.device.stats.loads == 1                                   # one load per module per process
    # Statics are per bo_key; inputs/intermediates/outputs are shared by the bo_keys of one module.
    static = sum(a.nbytes for a in decls[0].args if a.role is Role.STATIC)
    assert kc.allocated_bytes == 2 * static + sum(a.nbytes for a in decls[0].args if a.role is not Role.STATIC)


def test_bad_calls_name_module_and_arg(built):
    cache_dir, decls = built
    kc = ModuleExecutor(EmuDevice(), cache_dir, decls)
    rng = np.random.default_rng(4)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    with pytest.raises(ValueError, match="add_norm arg r: input missing"):
        kc.load_and_run("add_norm", x, None, w)
    with pytest.raises(ValueError, match="add_norm arg w: static missing"):
        kc.load_and_run("add_norm", x, r)
    with pytest.raises(ValueError, match=r"add_norm arg x: shape \(4, 32\)"):
        kc.load_and_run("add_norm", x[:, :32].copy(), r, w)
    with pytest.raises(ValueError, match="add_norm arg x: dtype float32"):
        kc.load_and_run("add_norm", x.astype(np.float32), r, w)
    with pytest.raises(ValueError, match="add_norm arg y: role output"):
        kc.load_and_run("add_norm", x, r, w, y=np.zeros((R, D), BF16))
    with pytest.raises(ValueError, match="unknown argument 'q'"):
        kc.load_and_run("add_norm", x, r, w, q=x)
    with pytest.raises(ValueError, match="unknown module"):
        kc.load_and_run("nope", x)
    assert kc.counters == {}      # nothing was transferred by the rejected calls


def test_null_device_counts_the_same_bytes_as_emu(built):
    cache_dir, decls = built
    rng = np.random.default_rng(5)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    rows = []
    for dev in (EmuDevice(), NullDevice()):
        kc = ModuleExecutor(dev, cache_dir, decls)
        kc.load_and_run("add_norm", x, r, w, bo_key="a")
        kc.load_and_run("add_norm", x, r, bo_key="a")
        out = kc.load_and_run("add_norm", x, r, w, bo_key="b")
        rows.append(([(c["calls"], c["bytes_written"], c["bytes_read"]) for c in kc.report()],
                     dev.stats.bytes_written, dev.stats.bytes_read, dev.stats.runs, dev.stats.allocated_bytes))
        if isinstance(dev, NullDevice):
            assert not out["y"].any()                     # null computes nothing
    assert rows[0] == rows[1]
    assert rows[0][0] == [(3, 3 * 2 * R * D * 2 + 2 * D * 2, 3 * R * D * 2)]


def test_emu_shadow_copy_gives_the_same_bytes_as_plain_bf16(built):
    cache_dir, decls = built
    rng = np.random.default_rng(6)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    outs = [ModuleExecutor(EmuDevice(shadow_f32=s), cache_dir, decls).load_and_run("add_norm", x, r, w)["y"]
            for s in (True, False)]
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


def test_registry_decode_module_contract_emu_and_null(tmp_path):
    """Integration with the real declarations: after preload, a decode call of ffn_dec writes only
    its INPUT bytes and reads only its OUTPUT bytes, on emu and on null alike; layers stay apart."""
    shapes = ModelShapes(hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, ffn=128, vocab=256,
                         n_layers=2, rms_eps=1e-5)
    decl = next(d for d in LlamaModel(shapes).decode().decls if d.name == "ffn_dec")
    rep = build_modules([decl], tmp_path, "emu", progress=False)
    rng = np.random.default_rng(7)
    statics = [{a.name: to_bf16(rng.standard_normal(a.shape) * 0.1) for a in decl.args if a.role is Role.STATIC}
               for _ in range(2)]
    inputs = {a.name: to_bf16(rng.standard_normal(a.shape)) for a in decl.args if a.role is Role.INPUT}
    in_bytes = sum(a.nbytes for a in decl.args if a.role is Role.INPUT)
    out_bytes = sum(a.nbytes for a in decl.args if a.role is Role.OUTPUT)
    counts = []
    for dev in (EmuDevice(), NullDevice()):
        kc = ModuleExecutor(dev, rep.artifacts, [decl])
        for layer, st in enumerate(statics):
            kc.preload("ffn_dec", bo_key=f"L{layer}", **st)
        kc.reset_counters()
        y0 = kc.load_and_run("ffn_dec", bo_key="L0", **inputs)
        y1 = kc.load_and_run("ffn_dec", bo_key="L1", **inputs)
        y0b = kc.load_and_run("ffn_dec", bo_key="L0", **inputs)
        c = kc.counters["ffn_dec"]
        assert (c.bytes_written, c.static_bytes_written, c.bytes_read) == (3 * in_bytes, 0, 3 * out_bytes)
        counts.append((c.calls, c.bytes_written, c.bytes_read, dev.stats.bytes_written, dev.stats.runs))
        if isinstance(dev, EmuDevice):
            name = decl.names(Role.OUTPUT)[0]
            assert not np.array_equal(y0[name], y1[name])
            np.testing.assert_array_equal(y0[name].view(np.uint16), y0b[name].view(np.uint16))
    assert counts[0] == counts[1]


def test_module_family_shares_a_layers_static_buffers(tmp_path):
    """Prefill buckets are one family: a layer's weights are resident once, written once, and still
    kept apart per bo_key (layer)."""
    import dataclasses

    a = dataclasses.replace(add_norm("fam_a"), family="fam")
    b = dataclasses.replace(add_norm("fam_b"), family="fam")
    other = add_norm("solo")  # same arg names and shapes, different family: must not share
    report = build_modules([a, b, other], tmp_path, "emu", progress=False)
    kc = ModuleExecutor(EmuDevice(), report.artifacts, [a, b, other])
    rng = np.random.default_rng(5)
    w0, w1 = _rand(rng, (D,)), _rand(rng, (D,)) * to_bf16(2.0)
    x, r = _rand(rng, (R, D)), _rand(rng, (R, D))
    kc.write_static("fam_a", bo_key="L0", w=w0)
    kc.write_static("fam_a", bo_key="L1", w=w1)
    kc.write_static("fam_b", bo_key="L0", w=w0)          # already resident through fam_a: not re-sent
    assert kc.counters["fam_b"].static_bytes_written == 0
    yb1 = kc.load_and_run("fam_b", x, r, None, bo_key="L1")["y"]   # L1 statics came from fam_a
    np.testing.assert_array_equal(yb1.view(np.uint16), _expected_add_norm(x, r, w1).view(np.uint16))
    with pytest.raises(ValueError, match="static missing"):
        kc.load_and_run("solo", x, r, None, bo_key="L0")           # another family shares nothing
    w_bytes = a.arg("w").nbytes
    acts = sum(arg.nbytes for arg in a.args if arg.role is not Role.STATIC)
    # two layers of statics for the family and one activation set per module that ran (the rejected
    # `solo` call was validated before anything was allocated)
    assert kc.allocated_bytes == 2 * w_bytes + 2 * acts


# ---------------------------------------------------------------- device-side hand-off (refs, read=)
def test_ref_binds_another_modules_buffer_without_a_host_write(built):
    """add_norm's y feeds add_norm's input x of the next call through a ref: 0 bytes written for x,
    same bytes as the host round trip."""
    cache_dir, decls = built
    rng = np.random.default_rng(8)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    host = ModuleExecutor(EmuDevice(), cache_dir, decls)
    y1 = host.load_and_run("add_norm", x, r, w)["y"]
    y2 = host.load_and_run("add_norm", y1, r)["y"]
    dev = ModuleExecutor(EmuDevice(), cache_dir, decls)
    dev.load_and_run("add_norm", x, r, w, read=())
    c = dev.counters["add_norm"]
    assert c.bytes_read == 0                                  # read=(): y stayed on the device
    before = c.bytes_written
    out = dev.load_and_run("add_norm", dev.ref("add_norm", "y"), r)
    assert c.bytes_written - before == R * D * 2              # r only; x came from y on the device
    np.testing.assert_array_equal(out["y"].view(np.uint16), y2.view(np.uint16))
    # the unaliased call afterwards writes x again and gets the host-path result
    np.testing.assert_array_equal(dev.load_and_run("add_norm", x, r)["y"].view(np.uint16), y1.view(np.uint16))


def test_ref_errors_name_both_ends(built):
    cache_dir, decls = built
    kc = ModuleExecutor(NullDevice(), cache_dir, decls)
    rng = np.random.default_rng(9)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    with pytest.raises(ValueError, match="add_norm arg x: ref to add_norm.y, but add_norm has not run yet"):
        kc.load_and_run("add_norm", kc.ref("add_norm", "y"), r, w)
    assert kc.counters == {}
    kc.load_and_run("lm_head_gemv_t", _rand(rng, (64, 64)), _rand(rng, (1, 64)))
    kc.load_and_run("add_norm", x, r, w)
    with pytest.raises(ValueError, match=r"add_norm arg x \(bf16, \d+ bytes\) cannot alias lm_head_gemv_t\.y "
                                         r"\(bf16, 128 bytes\)"):
        kc.load_and_run("add_norm", kc.ref("lm_head_gemv_t", "y"), r)
    with pytest.raises(ValueError, match="a static"):
        kc.load_and_run("add_norm", kc.ref("add_norm", "w"), r)
    with pytest.raises(ValueError, match="role static cannot take a ref"):
        kc.load_and_run("add_norm", x, r, kc.ref("add_norm", "w"))
    with pytest.raises(ValueError, match="unknown argument 'nope'"):
        kc.ref("add_norm", "nope")
    with pytest.raises(ValueError, match=r"read= names \['s'\], which are not outputs"):
        kc.load_and_run("add_norm", x, r, read=("s",))


def test_ref_alias_within_one_run_follows_launch_order(tmp_path, monkeypatch):
    """ffn_dec (declared without the decode's residual fusion, so the add is its own launch) reads its residual
    x in launch 1 (after launch 0 wrote proj) and writes x_out in its last launch. x bound to the module's own
    x_out (the engine's layer-to-layer hand-off) is safe and bit-identical to the host round trip; x bound to
    proj would be overwritten before it is read: rejected before anything runs."""
    from llama_npu.models import lowering
    monkeypatch.delitem(lowering.RULES, ("linear", "add"))
    shapes = ModelShapes(hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, ffn=128, vocab=256,
                         n_layers=1, rms_eps=1e-5)
    decl = next(d for d in LlamaModel(shapes).decode().decls if d.name == "ffn_dec")
    rep = build_modules([decl], tmp_path, "emu", progress=False)
    rng = np.random.default_rng(10)
    statics = {a.name: to_bf16(rng.standard_normal(a.shape) * 0.1) for a in decl.args if a.role is Role.STATIC}
    attn, x = (to_bf16(rng.standard_normal(decl.arg(n).shape)) for n in ("attn", "x"))
    host = ModuleExecutor(EmuDevice(), rep.artifacts, [decl])
    x1 = host.load_and_run("ffn_dec", attn=attn, x=x, **statics)["x_out"]
    x2 = host.load_and_run("ffn_dec", attn=attn, x=x1.reshape(x.shape))["x_out"]
    kc = ModuleExecutor(EmuDevice(), rep.artifacts, [decl])
    kc.load_and_run("ffn_dec", attn=attn, x=x, read=(), **statics)
    runs = kc.device.stats.runs
    with pytest.raises(ValueError, match="arg x aliases proj, which launch order overwrites before launch 1"):
        kc.load_and_run("ffn_dec", attn=attn, x=kc.ref("ffn_dec", "proj"))
    assert kc.device.stats.runs == runs
    out = kc.load_and_run("ffn_dec", attn=attn, x=kc.ref("ffn_dec", "x_out"))["x_out"]
    np.testing.assert_array_equal(out.view(np.uint16), x2.view(np.uint16))


def test_loaded_modules_stay_within_the_devices_context_limit(tmp_path):
    """At the device's limit of loaded modules (hardware contexts), the least recently used module is
    unloaded and reloads on its next call; results and buffers are unaffected."""
    decls = [add_norm("m0"), add_norm("m1"), add_norm("m2")]
    arts = build_modules(decls, tmp_path, "emu", progress=False).artifacts
    dev = EmuDevice()
    dev.max_loaded = 2
    kc = ModuleExecutor(dev, arts, decls)
    rng = np.random.default_rng(11)
    x, r, w = _rand(rng, (R, D)), _rand(rng, (R, D)), _rand(rng, (D,))
    want = _expected_add_norm(x, r, w)
    peak = 0
    for name in ("m0", "m1", "m2", "m0", "m1", "m0"):
        out = kc.load_and_run(name, x, r, w if name not in kc.bo_keys(name) else None)["y"]
        np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
        peak = max(peak, dev.stats.live_loaded)
    assert peak == 2
    # m0 m1 | m2 evicts m0 | m0 evicts m1 | m1 evicts m2 | m0 still loaded
    assert (dev.stats.loads, dev.stats.unloads) == (5, 3)


def test_emu_hands_gemv_its_stored_weights_read_only(built, monkeypatch):
    """With the host kernels built, the emulator passes a gemv its weight as the stored bf16 bytes (no f32
    shadow), as a read-only view: a kernel cannot change device weights behind the shadow's back."""
    from external_kernels import host_build as host_native
    from kernel_builder import reference
    from tooling import require_tool
    require_tool("g++")
    assert host_native.library() is not None
    seen = []

    def spy(w, x, **kw):
        seen.append((w.dtype, w.flags.writeable))
        return spy.real(w, x, **kw)
    spy.real = reference.gemv
    monkeypatch.setattr(reference, "gemv", spy)                 # raw_reads recognises the real gemv by identity
    monkeypatch.setitem(reference.KERNELS, "gemv", spy)
    cache_dir, decls = built
    kc = ModuleExecutor(EmuDevice(), cache_dir, decls)
    rng = np.random.default_rng(4)
    w, x = _rand(rng, (64, 64)), _rand(rng, (1, 64))
    out = kc.load_and_run("lm_head_gemv_t", w=w, x=x)
    assert seen == [(BF16, False)]
    exp = spy.real(w, x.reshape(64), m=64, k=64).reshape(1, 64)
    np.testing.assert_array_equal(out["y"].view(np.uint16), exp.view(np.uint16))
