"""The `dequant_q4` kernel (the token's embedding row from the 4-bit vocabulary matrix): the C++ scalar path and
the AIE2P vector path (host aie_api, counts against the cost descriptor) give the reference's bf16 rows bit for
bit (= the weights gemv_q4 multiplies), an off-by-one mutant fails, the builder on emu-interp, the hardware model
at Llama widths."""
from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest
from tooling import require_tool

from external_kernels import compile_rules
from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host
from kernel_builder.dequant_q4 import external as dq_ext
from kernel_builder.dequant_q4.reference import dequant_q4
from kernel_builder.gemv_q4.format import pack
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16

VARIANTS = [(576, 32, 1, 1), (256, 128, 1, 2), (256, 32, 0, 1)]   # (k, group, mins, rows)


def _rows(k, group, mins, rows, seed=3):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, size=(rows, k)) if mins else rng.integers(-8, 8, size=(rows, k))
    s = to_bf16(rng.uniform(0.01, 0.1, size=(rows, k // group)).astype(np.float32))
    z = to_bf16(rng.uniform(-0.5, 0.0, size=(rows, k // group)).astype(np.float32)) if mins else None
    p = pack(codes, s, z, group)
    return p, dequant_q4(p.view(np.int8), rows=rows, k=k, group=group, mins=mins)


@pytest.fixture(scope="module")
def scalar_lib(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("dq_host")
    objs = []
    for v in VARIANTS:
        kern = dq_ext.dequant_q4_kernel(*v)
        res = subprocess.run(compile_rules.host_compile_command(kern, out, cxx=cxx) + ["-Wall", "-Wextra"],
                             capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        objs.append(out / compile_rules.host_object_name(kern))
    so = out / "libdq.so"
    subprocess.run(compile_rules.host_link_command(objs, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("v", VARIANTS)
def test_scalar_path_matches_reference(scalar_lib, v):
    k, group, mins, rows = v
    p, want = _rows(*v)
    y = np.zeros((rows, k), BF16)
    f = getattr(scalar_lib, dq_ext.dequant_q4_kernel(*v).symbol)
    f.argtypes = [ctypes.c_void_p] * 2
    f(np.ascontiguousarray(p).ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y, want)


def _vector(v, p, lib=None):
    kern = dq_ext.dequant_q4_kernel(*v)
    y = aie_host.aligned(np.zeros(v[3] * v[0], BF16))
    counts = (lib or aie_host.load(kern)).call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p).reshape(-1)), y)
    return y.reshape(v[3], v[0]), counts


@pytest.mark.parametrize("v", VARIANTS)
def test_vector_path_matches_reference(v):
    p, want = _rows(*v)
    y, counts = _vector(v, p)
    np.testing.assert_array_equal(y, want)
    cost = dq_ext.COSTS[0]
    formula = cost.work(cost.pattern.fullmatch(dq_ext.dequant_q4_kernel(*v).symbol), []).counts
    assert Counts._of(formula).host() == {k2: n for k2, n in counts.items() if n}


def test_off_by_one_in_the_vector_path_fails(tmp_path):
    v = VARIANTS[0]
    text = (SOURCE_DIR / "dequant_q4.cc").read_text()
    mutated, n = re.subn(r"g < kGroups; \+\+g\) \{", "g < kGroups - 1; ++g) {", text)
    assert n == 1
    src = tmp_path / "dequant_q4.cc"
    src.write_text(mutated)
    p, want = _rows(*v)
    y, _ = _vector(v, p, aie_host.load(dq_ext.dequant_q4_kernel(*v), source=src))
    assert not np.array_equal(y, want)


@pytest.mark.parametrize("v", VARIANTS[:2])
def test_builder_on_the_interpreter(v):
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    k, group, mins, rows = v
    p, want = _rows(*v)
    y = np.zeros((rows, k), BF16)
    air_interp.compile_module(kernel_text("dequant_q4", rows, k, group, mins)).run([p.view(np.int8), y])
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("k", [576, 2048, 4096])
def test_hardware_model_accepts_embedding_rows(k):
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import kernel_text
    rep = analyze_module(kernel_text("dequant_q4", 1, k, 32, 1))
    assert rep.ok, rep.first_violation()
