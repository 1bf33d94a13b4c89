"""The layers import downwards only: kernel_builder knows nothing of the model layer or the runtime, the
import graph between packages is a DAG, and no module imports its own package's parent in a cycle.
Every import counts, including the ones inside functions (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("external_kernels", "kernel_builder", "multi_launch_builder", "llama_npu", "verify", "benchmarks")
# package -> the packages it may import (the layering of docs/architecture.md): each layer only the ones below it
ALLOWED = {"external_kernels": set(), "kernel_builder": {"external_kernels"},
           "multi_launch_builder": {"kernel_builder", "external_kernels"},
           "llama_npu": {"multi_launch_builder", "kernel_builder", "external_kernels"},
           "verify": {"multi_launch_builder", "kernel_builder", "external_kernels", "llama_npu"},
           "benchmarks": {"multi_launch_builder", "kernel_builder", "external_kernels", "llama_npu"}}
MODEL_FREE = ("external_kernels", "kernel_builder", "multi_launch_builder")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of our modules that `path` imports (relative imports resolved)."""
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import sub` depends on the submodule; `from mod import name` on the module
            names = [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for imp in _imports(path):
            while imp and imp not in modules:     # `from pkg.mod import func` -> pkg.mod
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                deps.add(imp)
        graph[name] = deps
    return graph


def test_packages_import_only_downwards():
    bad = [(m, d) for m, deps in _graph().items() for d in deps
           if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert bad == [], f"imports against the layering: {bad}"


def test_kernel_layer_names_no_model_module():
    """Nothing below the model layer mentions the Llama family's modules or tensors."""
    words = ("qkv_s", "ffn_dec", "lm_head_gemv", "rms_gemms_rope", "o_ffn", "q_proj", "Llama", "SmolLM")
    hits = [(str(p.relative_to(ROOT)), w) for pkg in MODEL_FREE for p in (ROOT / pkg).rglob("*.py")
            for w in words if w in p.read_text()]
    assert hits == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str):
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_module_import_graph_has_no_cycle():
    cycle = find_cycle(_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_checker_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_package_is_installed():
    """setuptools' package discovery (pyproject's packages.find) finds every package directory of the installed
    layers (a non-editable install would miss a forgotten one: `kernel_builder.hw` once was)."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    listed = set(find_packages(str(ROOT), include=find["include"], exclude=find.get("exclude", ())))
    layers = [pkg for pkg in PACKAGES if pkg != "benchmarks"]
    found = {_module_name(p.parent / "__init__.py") for pkg in layers for p in (ROOT / pkg).rglob("*.py")}
    assert found <= listed, f"not installed: {sorted(found - listed)}"
