"""Adding a kernel touches one folder plus one registration line (docs/architecture.md "Adding a kernel"): every
kernel package defines its SPEC, kernel_builder.registry.KINDS names exactly those packages, and the tables the
other layers read (signatures, references, external families, cost rows) come from the specs - no other module
lists the kernels."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from external_kernels.paths import SOURCE_DIR
from kernel_builder.external_costs import external_cost, external_costs
from kernel_builder.externals import families, family_of_symbol
from kernel_builder.reference import KERNELS
from kernel_builder.registry import KINDS, SIGNATURES, spec

ROOT = Path(__file__).resolve().parents[1]
KB = ROOT / "kernel_builder"


def test_kinds_are_exactly_the_kernel_packages():
    packages = {d.name for d in KB.iterdir() if (d / "builder.py").exists()}
    assert set(KINDS) == packages and len(KINDS) == len(set(KINDS))
    for kind in KINDS:
        files = {p.name for p in (KB / kind).glob("*.py")}
        assert {"__init__.py", "builder.py", "plan.py", "reference.py", "external.py"} <= files, kind
        assert spec(kind).kind == kind


def test_the_tables_come_from_the_specs():
    assert list(SIGNATURES) == list(KINDS) == list(KERNELS)
    # each kind's own family first; a kind may add more (rmsnorm: rmsnorm_bfp.cc, its block-float output)
    assert [spec(k).families[0].name for k in KINDS] == list(KINDS)
    assert len({f.name for f in families()}) == len(families())
    assert len(external_costs()) == sum(len(spec(k).costs) for k in KINDS)
    for fam in families():
        assert (SOURCE_DIR / fam.source).is_file(), fam.source


@pytest.mark.parametrize("symbol,kind", [("mv_bf16_k576_c576_m4_r72", "gemv"), ("add_bf16_n4096", "add"),
                                         ("attnd_step_bf16_hd64_q1_k64_n8", "attention")])
def test_a_symbol_finds_its_kernels_family_and_cost(symbol, kind):
    fam, _ = family_of_symbol(symbol)
    assert fam is spec(kind).families[0]
    assert external_cost(symbol)[0] in spec(kind).costs


def test_unknown_kind_is_one_clear_error():
    with pytest.raises(KeyError, match="unknown kernel 'silu' .registered: rmsnorm, gemm"):
        spec("silu")


def test_no_other_module_lists_the_kernels():
    """A literal tuple/list/set/dict naming three or more kinds outside the kernel packages and the registry is a
    second list a new kernel would have to be added to."""
    kinds = set(KINDS)
    hits = []
    for layer in ("kernel_builder", "multi_launch_builder", "external_kernels"):
        for path in (ROOT / layer).rglob("*.py"):
            if path.parent.name in kinds or path == KB / "registry.py":
                continue
            tree = ast.parse(path.read_text())
            exports = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assign)
                       and any(isinstance(t, ast.Name) and t.id == "__all__" for t in a.targets) for n in ast.walk(a)}
            for node in ast.walk(tree):
                if id(node) not in exports and isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                    elts = node.keys if isinstance(node, ast.Dict) else node.elts
                    names = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in kinds}
                    if len(names) >= 3:
                        hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert hits == []
