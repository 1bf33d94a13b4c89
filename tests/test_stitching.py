"""The stitcher and the launch-program reader on hand-written, deliberately hostile kernel modules:
identical SSA/map/herd names in every slice, `@herd_1` next to `@herd_10`, strided layouts, `%arg0` inside
comments and strings, shadowed names inside isolated regions, bare herds, and every kind of bad wiring."""
from __future__ import annotations

import dataclasses

import re

import numpy as np
import pytest

import air_checks
import air_generic
from kernel_builder import mlir_text as mt
from multi_launch_builder.emulator.launch_program import read_launch_program, run_program, run_program_io
from kernel_builder.presets import AirccPreset, preset_of_text
from multi_launch_builder.stitcher import SigArg, Slice, stitch, stitch_modules
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from tooling import require_tool

V4 = "memref<4xbf16>"
STRIDED = "memref<2x2xbf16, strided<[2, 1], offset: ?>>"
EXT_DECL = ('func.func private @ext_scale(memref<4xbf16, 2 : i32>) attributes {link_with = "ext.o", '
            "llvm.emit_c_interface}")


def kernel_module(kind: str, types: list[str], *, bare: bool = False, extern: str | None = EXT_DECL,
                  order: list[int] | None = None, attr: str | None = None, with_map: bool = True) -> str:
    """A small but complete kernel module with the names every slice shares (%c1, %0, #map, @herd_1,
    @herd_10, @seg), `%arg0` in a comment and a string, and a local `%arg0` inside the herd region."""
    n = len(types)
    params = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(types))
    order = list(range(n)) if order is None else order
    ltypes = ", ".join(types[i] for i in order)
    kattr = attr if attr is not None else f'llama_npu.kernel = {{kind = "{kind}", n = {n}, note = "%arg0 @herd_1"}}'
    hargs = ", ".join(f"%h{i}=%ARG{i}" for i in range(n))
    call = "      func.call @ext_scale(%buf) : (memref<4xbf16, 2 : i32>) -> ()\n" if extern else ""
    herd = (f"air.herd @herd_1 tile (%tx, %ty) in (%hx=%c2, %hy=%c1h) args({hargs}) : {', '.join(types)} "
            f"attributes {{{kattr + ', ' if bare else ''}link_with = \"ext.o\"}} {{\n"
            "      %arg0 = arith.constant 0 : index  // a local value named like a function argument\n"
            + ("      %i = affine.apply #map(%arg0, %tx)\n" if with_map else "      %i = arith.addi %arg0, %tx : index\n") +
            "      %buf = memref.alloc() : memref<4xbf16, 2 : i32>\n"
            f"{call}"
            "      memref.dealloc %buf : memref<4xbf16, 2 : i32>\n"
            "    }")
    if not bare:  # a bare-herd kernel has exactly one herd
        herd += "\n    air.herd @herd_10 tile (%tx, %ty) in (%hx=%c1h, %hy=%c1h) {\n    }"
    lines = (["#map = affine_map<(d0, d1) -> (d0 + d1)>"] if with_map else []) + ["module {"]
    if extern:
        lines.append("  " + extern)
    lines.append(f"  func.func @{kind}({params}) {{")
    lines.append("    // reads %arg0 and writes @herd_1 -- comments are never renamed")
    if bare:
        lines.append("    %c2 = arith.constant 2 : index")
        lines.append("    %c1h = arith.constant 1 : index")
        lines.append("    " + herd.replace("%ARG", "%arg").replace("\n    ", "\n    "))
    else:
        largs = ", ".join(f"%a{i}=%arg{i}" for i in order)
        sargs = ", ".join(f"%s{i}=%a{i}" for i in range(n))
        lines += [
            "    %c1 = arith.constant 1 : index",
            f"    %0 = air.launch async (%x) in (%sx=%c1) args({largs}) : {ltypes} attributes {{{kattr}}} {{",
            f"      air.segment @seg args({sargs}) : {', '.join(types)} {{",
            "        %c2 = arith.constant 2 : index",
            "        %c1h = arith.constant 1 : index",
            "        " + herd.replace("%ARG", "%s").replace("\n", "\n    "),
            "      }",
            "    }",
        ]
    lines += ["    return", "  }", "}", ""]
    return "\n".join(lines)


def copy_sig(*names_roles, type_=V4):
    return [SigArg(n, type_, r) for n, r in names_roles]


CHAIN_SIG = copy_sig(("x", Role.INPUT), ("w", Role.STATIC), ("t", Role.INTERMEDIATE), ("y", Role.OUTPUT))
CHAIN = [Slice("a", kernel_module("mul", [V4] * 3), ("x", "w", "t")),
         Slice("b", kernel_module("mul", [V4] * 3, bare=True), ("t", "w", "y"))]


def test_same_names_in_every_slice_do_not_collide():
    text = stitch_modules("chain", CHAIN_SIG, CHAIN)
    for p in ("a", "b"):
        for name in (f"%{p}_c2", f"@{p}_herd_1 ", f"#{p}_map"):
            assert name in text, name
    assert "#a_map = affine_map" in text and "#b_map = affine_map" in text
    # @herd_1 / @herd_10 stay distinct whole tokens
    assert "@a_herd_10 tile" in text and "@a_herd_1 tile" in text and "@a_herd_1_0" not in text
    # no un-prefixed local name survives outside comments and strings
    code = re.sub(r'"[^"]*"|//[^\n]*', "", text)
    assert not re.search(r"%(c1|c2|0|x|tx|i|buf)\b", code)
    assert not re.search(r"@(herd_1|herd_10|seg)\b", code)


def _checkable(slices):
    """Without `#map` and async launches: the form mlir-opt-22 verifies (it cannot parse AIR's async syntax)."""
    return [Slice(s.prefix, s.text.replace("#map = affine_map<(d0, d1) -> (d0 + d1)>\n", "")
                  .replace("affine.apply #map(%arg0, %tx)", "arith.addi %arg0, %tx : index")
                  .replace("%0 = air.launch async", "air.launch"), s.wiring)
            for s in slices]


def test_stitched_module_passes_air_structure_checks():
    rep = air_checks.check_module(stitch_modules("chain", CHAIN_SIG, _checkable(CHAIN)))
    assert rep.errors == []
    assert [k["kind"] for k in rep.kernels] == ["mul", "mul"]


def test_async_launches_and_aliases_stitch_and_pass_air_checks():
    """`%t = air.launch async [%dep]`, `!type` aliases in signatures and `#attr` aliases in layouts: the
    stitcher renames them per slice and compares kernel types with the aliases expanded."""
    def mod():
        t = "!bt = memref<4xbf16>\n#lay = strided<[1], offset: ?>\n" + kernel_module(
            "mul", ["!bt", "memref<4xbf16, #lay>", "!bt"])
        t = t.replace("%c1 = arith.constant 1 : index", "%c1 = arith.constant 1 : index\n    %d = air.wait_all async")
        return t.replace("%0 = air.launch async (%x)", "%0 = air.launch async [%d] (%x)")
    sig = [SigArg("x", V4, Role.INPUT), SigArg("w", "memref<4xbf16, strided<[1], offset: ?>>", Role.STATIC),
           SigArg("t", V4, Role.INTERMEDIATE), SigArg("y", V4, Role.OUTPUT)]
    text = stitch_modules("h", sig, [Slice("a", mod(), ("x", "w", "t")), Slice("b", mod(), ("t", "w", "y"))])
    assert "!a_bt = memref<4xbf16>" in text and "!b_bt = memref<4xbf16>" in text
    assert "air.launch async [%a_d]" in text and "air.launch async [%b_d]" in text
    assert [lp.operands for lp in read_launch_program(text).launches] == [(0, 1, 2), (2, 1, 3)]
    rep = air_checks.check_module(text)
    assert rep.errors == [] and [k["kind"] for k in rep.kernels] == ["mul", "mul"]
    with pytest.raises(ValueError, match="slice 'a' .*kernel argument 1 .*has type memref<4xbf16, #lay>"):
        stitch_modules("h", [SigArg(a.name, V4, a.role) for a in sig],
                       [Slice("a", mod(), ("x", "w", "t")), Slice("b", mod(), ("t", "w", "y"))])


def test_air_checks_reads_the_unmodified_hostile_modules():
    rep = air_checks.check_module(stitch_modules("chain", CHAIN_SIG, CHAIN))   # #map and async launches
    assert rep.errors == [] and [k["kind"] for k in rep.kernels] == ["mul", "mul"]


def test_stitched_module_verifies_with_mlir_opt():
    mlir_opt = require_tool("mlir-opt-22")
    text = stitch_modules("chain", CHAIN_SIG, _checkable(CHAIN))
    air_generic.mlir_opt_verify(mlir_opt, air_generic.to_generic(text))
    for _, herd_module in air_generic.herd_modules(text):
        air_generic.mlir_opt_verify(mlir_opt, herd_module)


def test_comments_strings_and_shadowed_names_are_untouched():
    text = stitch_modules("chain", CHAIN_SIG, CHAIN)
    assert text.count("// reads %arg0 and writes @herd_1 -- comments are never renamed") == 2
    assert text.count('note = "%arg0 @herd_1"') == 2
    # inside the isolated herd region `%arg0` is a local value: prefixed, never rewired to the signature
    assert "%a_arg0 = arith.constant 0 : index" in text and "affine.apply #a_map(%a_arg0, %a_tx)" in text
    assert "%b_arg0 = arith.constant 0 : index" in text


def test_wiring_read_back_from_text():
    prog = read_launch_program(stitch_modules("chain", CHAIN_SIG, CHAIN))
    assert prog.name == "chain" and prog.arg_shapes == ((4,),) * 4
    assert [(l.kind, l.operands) for l in prog.launches] == [("mul", (0, 1, 2)), ("mul", (2, 1, 3))]
    assert prog.launches[0].params == {"n": 3, "note": "%arg0 @herd_1"}


def test_bare_herd_is_wrapped_in_launch_and_segment():
    text = stitch_modules("chain", CHAIN_SIG, CHAIN)
    func = mt.parse_module(text).public_funcs()[0]
    ops, _ = mt.body_ops(func)
    launches = [op for op in ops if mt.op_name(op) == "air.launch"]
    assert len(launches) == 2 and len(ops) == 3  # slice a: %a_c1 + launch; slice b: just the wrapper launch
    op = mt.parse_air_op(launches[1])
    assert op.attributes["llama_npu.kernel"]["kind"] == "mul"
    assert [o for _, o in op.args] == ["arg2", "arg1", "arg3"]
    inner = op.text[op.region[0]:op.region[1]]
    assert "air.segment @b_herd_1_segment" in inner
    herd_line = next(ln for ln in inner.splitlines() if "air.herd @b_herd_1 " in ln)
    assert 'link_with = "ext.o"' in herd_line and "llama_npu.kernel" not in herd_line
    assert "%b_segment_arg0" in herd_line  # herd operands rewired to the segment's block arguments
    assert "%b_c2 = arith.constant 2" in inner  # constants moved inside the isolated launch


def test_strided_layout_in_signature_survives():
    sig = [SigArg("x", STRIDED, Role.INPUT), SigArg("y", STRIDED, Role.OUTPUT)]
    text = stitch_modules("s", sig, [Slice("p", kernel_module("copy", [STRIDED, STRIDED]), ("x", "y"))])
    assert f"%arg0: {STRIDED}," in text and f"%arg1: {STRIDED}  // y (output)" in text
    assert read_launch_program(text).arg_shapes == ((2, 2), (2, 2))


def test_private_declarations_deduplicated_and_extern_symbols_kept():
    text = stitch_modules("chain", CHAIN_SIG, CHAIN)
    assert text.count("func.func private @ext_scale") == 1
    assert text.count("func.call @ext_scale(") == 2 and "_ext_scale" not in text


def test_conflicting_private_declarations_name_both_slices():
    other = EXT_DECL.replace("memref<4xbf16, 2 : i32>", "memref<8xbf16, 2 : i32>", 1)
    slices = [CHAIN[0], Slice("b", kernel_module("mul", [V4] * 3, extern=other), ("t", "w", "y"))]
    with pytest.raises(ValueError, match=r"@ext_scale.*slice 'a'.*slice 'b'"):
        stitch_modules("chain", CHAIN_SIG, slices)


def test_output_is_deterministic():
    assert stitch_modules("chain", CHAIN_SIG, CHAIN) == stitch_modules("chain", CHAIN_SIG, CHAIN)


def _with_wiring(w0, w1, sig=CHAIN_SIG):
    return lambda: stitch_modules("chain", sig, [Slice("a", CHAIN[0].text, w0), Slice("b", CHAIN[1].text, w1)])


@pytest.mark.parametrize("w0, w1, pattern", [
    (("x", "w", "nope"), ("t", "w", "y"), r"slice 'a'.*argument 2.*'nope'.*not an argument"),
    (("x", "w"), ("t", "w", "y"), r"slice 'a'.*wiring names 2 arguments.*takes 3"),
    (("x", "w", "t", "y"), ("t", "w", "y"), r"slice 'a'.*wiring names 4 arguments"),
    (("x", "x", "t"), ("t", "x", "y"), r"argument 'w' is not used by any slice"),
    (("x", "w", "y"), ("t", "w", "y"), r"'y' is written by two slices: slice 'a'.*and slice 'b'"),
    (("x", "w", "t"), ("t", "y", "x"), r"slice 'b'.*writes argument 'x'.*role input"),
    (("t", "w", "y"), ("x", "w", "t"), r"slice 'a'.*reads intermediate 't' before slice 'b'.* writes it"),
    (("x", "w", "t"), ("t", "t", "y"), None),  # reading an intermediate twice is fine
    (("x", "w", "t"), ("t", "y", "t"), r"'t' is written by two slices"),
])
def test_bad_wiring_fails_naming_slice_and_argument(w0, w1, pattern):
    if pattern is None:
        _with_wiring(w0, w1)()
        return
    with pytest.raises(ValueError, match=pattern):
        _with_wiring(w0, w1)()


def test_in_place_and_unwritten_and_unread():
    sig = copy_sig(("x", Role.INPUT), ("t", Role.INTERMEDIATE), ("y", Role.OUTPUT))
    one = kernel_module("mul", [V4] * 3)
    with pytest.raises(ValueError, match=r"slice 'a'.*reads and writes argument 't'"):
        stitch_modules("m", sig, [Slice("a", one, ("x", "t", "t")), Slice("b", one, ("t", "x", "y"))])
    with pytest.raises(ValueError, match=r"'y' has role output but no slice writes it"):
        stitch_modules("m", sig, [Slice("a", one, ("x", "y", "t"))])
    with pytest.raises(ValueError, match=r"intermediate 't' is written by slice 'a'.*never read"):
        stitch_modules("m", sig, [Slice("a", one, ("x", "x", "t")), Slice("b", one, ("x", "x", "y"))])


def test_type_mismatch_names_slice_and_argument():
    sig = [SigArg("x", V4, "input"), SigArg("w", "memref<8xbf16>", "static"), SigArg("t", V4, "intermediate"),
           SigArg("y", V4, "output")]
    with pytest.raises(ValueError, match=r"slice 'a'.*argument 1 \(%arg1\) has type memref<4xbf16> but module "
                                         r"argument 'w' has type memref<8xbf16>"):
        stitch_modules("chain", sig, CHAIN)


def test_prefix_collision_is_detected_not_merged():
    # prefix `q` + name `k_c1` and prefix `q_k` + name `c1` would both become %q_k_c1
    a = kernel_module("mul", [V4] * 3).replace("%c1 ", "%k_c1 ").replace("%c1)", "%k_c1)")
    sig = copy_sig(("x", "input"), ("w", "static"), ("t", "intermediate"), ("y", "output"))
    with pytest.raises(ValueError, match=r"two different names to ssa 'q_k_c1'"):
        stitch_modules("m", sig, [Slice("q", a, ("x", "w", "t")), Slice("q_k", CHAIN[0].text, ("t", "w", "y"))])


def test_kernel_contract_violations():
    sig = copy_sig(("x", "input"), ("y", "output"))
    shuffled = kernel_module("copy", [V4, V4], order=[1, 0])
    with pytest.raises(ValueError, match=r"slice 'p'.*canonical order \(%arg0, %arg1\).*\(%arg1, %arg0\)"):
        stitch_modules("m", sig, [Slice("p", shuffled, ("x", "y"))])
    no_attr = kernel_module("copy", [V4, V4], attr="foo = 1")
    with pytest.raises(ValueError, match=r"slice 'p'.*llama_npu.kernel"):
        stitch_modules("m", sig, [Slice("p", no_attr, ("x", "y"))])
    with pytest.raises(ValueError, match=r"slice 'p': cannot parse"):
        stitch_modules("m", sig, [Slice("p", "module { func.func @f(%arg0: memref<4xbf16> {", ("x", "y"))])
    with pytest.raises(ValueError, match=r"prefix 'p-1'"):
        stitch_modules("m", sig, [Slice("p-1", kernel_module("copy", [V4, V4]), ("x", "y"))])


def test_stitch_from_declaration_uses_arg_memref_types():
    decl = ModuleDecl("d", (Arg("x", (4,), Role.INPUT), Arg("w", (4,), Role.STATIC),
                            Arg("t", (4,), Role.INTERMEDIATE), Arg("y", (4,), Role.OUTPUT)),
                      (Launch("a", lambda: CHAIN[0].text, ("x", "w", "t")),
                       Launch("b", lambda: CHAIN[1].text, ("t", "w", "y"))))
    text = stitch(decl)
    head, preset, rest = text.split("\n", 2)
    assert preset == "// aircc preset: " and preset_of_text(text) == AirccPreset()   # the default records nothing
    assert f"{head}\n{rest}" == stitch_modules("d", CHAIN_SIG, CHAIN)
    tiled = dataclasses.replace(decl, preset=AirccPreset(runtime_loop_tiling_sizes=(2, 2), stack_size=2048))
    assert preset_of_text(stitch(tiled)) == tiled.preset                               # read back by hw-check


# ---------------------------------------------------------------------------------- launch programs

class _Mul:
    """Toy executor: every launch computes prod(inputs) + n (its `n` param)."""

    def execute(self, launch, operands):
        out = np.ones_like(operands[-1], dtype=np.float32)
        for a in operands[:-1]:
            out = out * a
        return out + launch.params["n"]


def test_run_program_in_place_follows_the_text():
    prog = read_launch_program(stitch_modules("chain", CHAIN_SIG, CHAIN))
    x, w = np.array([1, 2, 3, 4], np.float32), np.array([2, 2, 2, 2], np.float32)
    bufs = [x, w, np.zeros(4, np.float32), np.zeros(4, np.float32)]
    run_program(prog, bufs, _Mul())
    np.testing.assert_array_equal(bufs[2], x * w + 3)
    np.testing.assert_array_equal(bufs[3], (x * w + 3) * w + 3)
    seen = {}
    run_program_io(prog, lambda i: [x, w, seen.get(2, 0), 0][i], seen.__setitem__, _Mul())
    assert sorted(seen) == [2, 3]


def test_read_launch_program_rejects_non_argument_operands():
    text = stitch_modules("chain", CHAIN_SIG, CHAIN).replace("args(%a_a0=%arg0", "args(%a_a0=%a_c1", 1)
    with pytest.raises(ValueError, match=r"launch 0 \(mul\) operand %a_a0=%a_c1 is not a function argument"):
        read_launch_program(text)


def test_read_launch_program_of_an_unstitched_bare_herd_module():
    prog = read_launch_program(kernel_module("mul", [V4] * 3, bare=True))
    assert [(l.kind, l.operands) for l in prog.launches] == [("mul", (0, 1, 2))]


def test_stitched_gemms_get_distinct_channels_and_use_their_own():
    """Every GEMM slice declares the same @gemm_a/@gemm_b/@gemm_c channels; stitched, each slice's channels are
    renamed with its prefix, declared once, and only that slice's segment/herd put/get on them (two GEMMs
    sharing a channel would feed one GEMM's panels into the other's tiles)."""
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    decl = next(d for d in LlamaModel(LLAMA32_1B).modules([64]) if d.name.startswith("ffn_s"))
    text = stitch(decl)
    rep = air_checks.check_module(text)
    assert rep.errors == []
    declared = re.findall(r"^\s*air\.channel @(\S+) ", text, re.M)
    assert len(declared) == len(set(declared)) == len(rep.channels)
    n_gemms = len(re.findall(r'kind = "gemm(_swiglu)?"', text))   # o, gate, up, down (or gemm_swiglu for both)
    assert n_gemms >= 3 and len(declared) == 3 * n_gemms
    # each launch's put/get only name channels of its own slice prefix
    launches = text.split("    // launch ")[1:]
    seen = set()
    for body in launches:
        prefix = body.split(" = ", 1)[0].split(": ", 1)[1]
        used = set(re.findall(r"air\.channel\.(?:put|get) @(\S+?)\[", body))
        if re.search(r'kind = "gemm(_swiglu)?"', body):
            assert used == {f"{prefix}_gemm_a", f"{prefix}_gemm_b", f"{prefix}_gemm_c"}, (prefix, used)
            assert not used & seen
            seen |= used
        else:
            assert not used
    assert seen == set(declared)
