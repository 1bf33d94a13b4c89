"""kernel_builder.mlir_text: lexer, balanced brackets, signatures, args lists, attribute dicts, renaming."""
from __future__ import annotations

import pytest

from kernel_builder import mlir_text as mt

STRIDED = "memref<1x2xbf16, strided<[2, 1], offset: ?>>"


def test_tokens_kinds():
    toks = mt.tokenize('%arg1#2 @herd_1 @"q s" #map1 !t // c %x\n"s %y" -> 1.0e-05 ^bb0 x.y')
    assert [(t.kind, t.text) for t in toks] == [
        ("ssa", "%arg1#2"), ("symbol", "@herd_1"), ("symbol", '@"q s"'), ("attr_alias", "#map1"),
        ("type_alias", "!t"), ("string", '"s %y"'), ("op", "->"), ("number", "1.0e-05"),
        ("label", "^bb0"), ("ident", "x.y")]


@pytest.mark.parametrize("text", [
    STRIDED,
    "affine_map<(d0, d1) -> (d0 + d1)>",
    "affine_set<(d0) : (d0 - 1 >= 0)>",
    '<{s = "a > b )", t = [1, 2]}>',
    "(a, <b> // ) comment\n, c)",
])
def test_match_bracket_closes_at_the_end(text):
    start = min(i for i in (text.find(c) for c in "(<{[") if i >= 0)
    assert mt.match_bracket(text + " tail", start) == len(text)


@pytest.mark.parametrize("text", ["(a]", "<a", "{[}]"])
def test_match_bracket_rejects_unbalanced(text):
    with pytest.raises(ValueError):
        mt.match_bracket(text, 0)


def test_split_top_level_keeps_commas_inside_types():
    parts = mt.split_top_level(f'{STRIDED}, memref<4xbf16>, "a,b", affine_map<(d0, d1) -> (d1, d0)>')
    assert parts == [STRIDED, "memref<4xbf16>", '"a,b"', "affine_map<(d0, d1) -> (d1, d0)>"]


def test_parse_func_signature_with_strided_types_and_comments():
    f = mt.parse_func(f"func.func @f(%arg0: {STRIDED},  // %arg9 here\n  %arg1: memref<4xbf16> {{llvm.noalias}}) "
                      "-> (i32, memref<2xf32>) attributes {foo = 1} {\n  return\n}")
    assert f.name == "f" and f.visibility is None
    assert f.params == (("arg0", STRIDED), ("arg1", "memref<4xbf16>"))
    assert f.results == ("i32", "memref<2xf32>")
    assert f.attributes == {"foo": 1}
    assert f.body_text.strip() == "return"


def test_parse_private_declaration():
    f = mt.parse_func('func.func private @k(memref<4xbf16, 2 : i32>, i32) attributes {link_with = "k.o", '
                      'llvm.emit_c_interface}')
    assert f.is_declaration and f.visibility == "private"
    assert f.params == ((None, "memref<4xbf16, 2 : i32>"), (None, "i32"))
    assert f.attributes == {"link_with": "k.o", "llvm.emit_c_interface": True}


def test_parse_attr_dict_values():
    d = mt.parse_attr_dict('{llama_npu.kernel = {kind = "gemm", m = 64, eps = 1.0e-05 : f32, neg = -3, '
                           'causal = true, h = 0x3F800000 : f32, l = [1, 2], u, m2 = affine_map<(d0) -> (d0)>}, '
                           '"q k" = "a\\"b"}')
    k = d["llama_npu.kernel"]
    assert k["kind"] == "gemm" and k["m"] == 64 and isinstance(k["m"], int)
    assert k["eps"] == pytest.approx(1e-5) and isinstance(k["eps"], float)
    assert k["neg"] == -3 and k["causal"] is True and k["h"] == 1.0 and k["l"] == [1, 2] and k["u"] is True
    assert isinstance(k["m2"], mt.RawAttr) and k["m2"] == "affine_map<(d0) -> (d0)>"
    assert d["q k"] == 'a"b'


def test_parse_attr_dict_rejects_garbage():
    with pytest.raises(ValueError):
        mt.parse_attr_dict("{a = 1")
    with pytest.raises(ValueError):
        mt.parse_attr_dict("{a = 1, a = 2}")


def test_attr_dict_entries_are_verbatim():
    assert mt.attr_dict_entries('{a = {b = 1, c = "x,y"}, link_with = "k.o"}') == [
        ("a", 'a = {b = 1, c = "x,y"}'), ("link_with", 'link_with = "k.o"')]


def test_parse_air_launch_header():
    op = (f"%t = air.launch @l async [%d0, %d1] (%x, %y) in (%sx=%c1, %sy = %c2) args(%a=%arg0, %b=%arg10) : "
          f"{STRIDED}, memref<4xbf16> attributes {{llama_npu.kernel = {{kind = \"rope\", rows = 4}}}} {{\n"
          "  air.segment @s { }\n}")
    a = mt.parse_air_op(op)
    assert (a.name, a.results, a.symbol, a.is_async) == ("air.launch", "%t", "l", True)
    assert a.deps == ("d0", "d1") and a.ids == ("x", "y") and a.sizes == (("sx", "c1"), ("sy", "c2"))
    assert a.args == (("a", "arg0"), ("b", "arg10")) and a.arg_types == (STRIDED, "memref<4xbf16>")
    assert a.attributes == {"llama_npu.kernel": {"kind": "rope", "rows": 4}}
    assert op[a.region[0]:a.region[1]].startswith("{") and op.endswith(op[a.region[0]:a.region[1]])


def test_parse_air_herd_and_segment_headers():
    h = mt.parse_air_op("air.herd @h tile (%tx, %ty) in (%sx=%c8, %sy=%c1) args(%a=%arg0) : memref<4xbf16> {\n}")
    assert h.symbol == "h" and h.ids == ("tx", "ty") and h.args == (("a", "arg0"),) and h.dict_span is None
    s = mt.parse_air_op("air.segment @s unroll(%u) in (%su=%c2) args() {\n}")
    assert s.ids == ("u",) and s.args == ()
    with pytest.raises(ValueError):
        mt.parse_air_op("air.launch () in () args(%a=%arg0, %b=%arg1) : memref<4xbf16> {\n}")


def test_parse_module_parts():
    text = ("#map = affine_map<(d0) -> (d0)>\n!t = memref<4xbf16>\nmodule {\n"
            "  func.func private @k(memref<4xbf16>)\n  air.channel @ch [1, 1]\n"
            "  // a comment line\n  func.func @f(%arg0: !t) {\n    return\n  }\n}\n")
    m = mt.parse_module(text)
    assert [(a.sigil, a.name) for a in m.aliases] == [("#", "map"), ("!", "t")]
    assert [f.name for f in m.funcs] == ["k", "f"] and m.others == ("air.channel @ch [1, 1]",)
    assert [f.name for f in m.public_funcs()] == ["f"] and [f.name for f in m.private_decls()] == ["k"]
    with pytest.raises(ValueError, match="after the module"):
        mt.parse_module(text + "func.func @g() {\n}\n")


def test_split_ops_multiline_regions():
    text = "%a = x\n// only a comment\nair.launch () in () {\n  %b = y\n\n}\n  return"
    assert [text[s:e] for s, e in mt.split_ops(text)] == ["%a = x", "air.launch () in () {\n  %b = y\n\n}",
                                                          "return"]


def test_rename_is_whole_token_and_skips_strings_and_comments():
    text = ('%arg1 %arg10 %arg1#0 @herd_1 @herd_10 #map1 #map10 "%arg1 @herd_1" // %arg1 @herd_1 #map1\n'
            "!t1 !t10 #dialect.attr")
    out = mt.rename(text, ssa=lambda n: "X" if n == "arg1" else None,
                    symbol=lambda n: "H" if n == "herd_1" else None,
                    attr_alias=lambda n: "M" if n == "map1" else None,
                    type_alias=lambda n: "T" if n == "t1" else None)
    assert out == ('%X %arg10 %X#0 @H @herd_10 #M #map10 "%arg1 @herd_1" // %arg1 @herd_1 #map1\n'
                   "!T !t10 #dialect.attr")


def test_rename_quoted_symbols():
    assert mt.rename('@"a b" @c', symbol=lambda n: "p_" + n) == '@"p_a b" @p_c'


def test_memref_shape():
    assert mt.memref_shape("memref<64x576xbf16>") == ((64, 576), "bf16")
    assert mt.memref_shape("memref<576xbf16>") == ((576,), "bf16")
    assert mt.memref_shape(STRIDED) == ((1, 2), "bf16")
    with pytest.raises(ValueError):
        mt.memref_shape("memref<?x4xbf16>")
    with pytest.raises(ValueError):
        mt.memref_shape("tensor<4xbf16>")
