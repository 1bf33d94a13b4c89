"""A small lexer/parser for the MLIR text our kernel builders generate.

Not a general MLIR parser: it understands exactly what the stitcher and the launch-program reader need —
tokens (strings, `//` comments, SSA values, symbols, aliases), balanced brackets (`<>`, `()`, `[]`, `{}`,
respecting strings, comments, `->` and `>=`), the module layout (aliases, module-level ops, funcs), the header
of `air.launch` / `air.segment` / `air.herd` ops and attribute dictionaries. Every parser works on raw text
spans so the text it does not interpret (types, region bodies) is carried over byte for byte.

Why text and not the MLIR Python bindings: the AIR dialect is not available on this machine (nor in CI), and
custom syntax of an unregistered dialect cannot be parsed by upstream MLIR.

Three modules: `lexer` (tokens, brackets, splitting, renaming), `attrs` (attribute dictionaries) and `ops`
(module layout, funcs, AIR op headers); their public names are re-exported here.
"""
from kernel_builder.mlir_text.attrs import RawAttr, attr_dict_entries, parse_attr_dict
from kernel_builder.mlir_text.lexer import (NameMap, Tok, first_tokens, iter_ops, match_bracket, names_in, normalize,
                                            rename, split_ops, split_top_level, strip_comments, tokenize)
from kernel_builder.mlir_text.ops import (AIR_REGION_OPS, AirOp, AliasDef, FuncOp, ModuleText, body_ops, is_comment,
                                          memref_shape, op_name, parse_air_op, parse_func, parse_module)

__all__ = ["Tok", "tokenize", "match_bracket", "split_top_level", "split_ops", "strip_comments", "normalize",
           "NameMap", "rename", "names_in", "first_tokens", "RawAttr", "parse_attr_dict", "attr_dict_entries",
           "FuncOp", "is_comment", "op_name", "parse_func", "AliasDef", "ModuleText", "parse_module", "body_ops",
           "AIR_REGION_OPS", "AirOp", "parse_air_op", "memref_shape"]
