"""Safetensors checkpoints read by memory map (no copies until a layout change needs one) and the
weight layouts each kernel module expects, prepared once at start-up.

Layouts (see multi_launch_builder registry):
  prefill GEMMs take [in, out]   -> HF `*.weight.T` (one transposed copy per tensor)
  decode GEMVs take [out, in]    -> the HF tensor itself (a view of the mapped file)
  lm_head_gemv takes row partitions from the planner, the last one zero-padded beyond vocab.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernel_builder.numerics import BF16, to_bf16

from .config import ModelConfig
from .errors import WeightsError

_DTYPES = {"BF16": BF16, "F16": np.dtype(np.float16), "F32": np.dtype(np.float32)}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorRef:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int   # absolute byte offsets inside the file
    end: int


def read_header(path: Path) -> dict[str, TensorRef]:
    """Parse and validate one safetensors header; the data is not read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise WeightsError(f"{path}: corrupt or truncated safetensors header "
                               f"(header claims {n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise WeightsError(f"{path}: corrupt safetensors header (not valid JSON)") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: corrupt safetensors header (not a JSON object)")
    base = 8 + n
    refs: dict[str, TensorRef] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"{path}: corrupt safetensors entry for tensor {name}") from None
        if base + hi > size:
            raise WeightsError(f"{path}: truncated safetensors file (tensor {name} needs bytes up to "
                               f"{base + hi}, file has {size})")
        refs[name] = TensorRef(path, dtype, shape, base + lo, base + hi)
    return refs


class Checkpoint:
    """All tensors of a (possibly sharded) safetensors checkpoint, mapped read-only."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError):
                raise WeightsError(f"{index}: corrupt safetensors index (no weight_map)") from None
            files = sorted({self.model_dir / f for f in weight_map.values()})
            missing = [f for f in files if not f.is_file()]
            if missing:
                raise WeightsError(f"{index}: shard {missing[0].name} is missing")
        else:
            files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"{self.model_dir}: no *.safetensors weights (other formats are not supported)")
        self.refs: dict[str, TensorRef] = {}
        for f in files:
            self.refs.update(read_header(f))
        self._maps: dict[Path, np.memmap] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.refs

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as a read-only array view of the mapped file (bf16 stays bf16; f16/f32 are
        kept as stored; callers round with `bf16()`)."""
        ref = self.refs.get(name)
        if ref is None:
            raise WeightsError(f"{self.model_dir}: tensor {name} is missing from the checkpoint")
        if shape is not None and ref.shape != tuple(shape):
            raise WeightsError(f"{ref.file.name}: tensor {name} has shape {list(ref.shape)}, "
                               f"expected {list(shape)}")
        dtype = _DTYPES.get(ref.dtype)
        if dtype is None:
            raise WeightsError(f"{ref.file.name}: tensor {name} has unsupported dtype {ref.dtype}")
        count = int(np.prod(ref.shape, dtype=np.int64)) if ref.shape else 1
        if ref.end - ref.start != count * dtype.itemsize:
            raise WeightsError(f"{ref.file.name}: tensor {name} byte range does not match its shape/dtype")
        mm = self._maps.get(ref.file)
        if mm is None:
            mm = self._maps[ref.file] = np.memmap(ref.file, dtype=np.uint8, mode="r")
        return mm[ref.start:ref.end].view(dtype).reshape(ref.shape)


def bf16(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == BF16 else to_bf16(a)


def transposed(a: np.ndarray) -> np.ndarray:
    """[out, in] -> contiguous bf16 [in, out] (the prefill GEMM `b` operand)."""
    return np.ascontiguousarray(bf16(a).T)


class ModelWeights:
    """Names, shapes and kernel layouts of a Llama checkpoint; tensors are produced on demand so that
    start-up holds at most one layer's transposed copies at a time."""

    def __init__(self, cfg: ModelConfig, checkpoint: Checkpoint | None = None):
        self.cfg = cfg
        self.ckpt = checkpoint or Checkpoint(cfg.model_dir)
        self.validate()

    # --- names and expected shapes -------------------------------------------------------------
    def layer_tensors(self, i: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        s = self.cfg.shapes
        p = f"model.layers.{i}."
        return {
            "attn_norm": (p + "input_layernorm.weight", (s.hidden,)),
            "ffn_norm": (p + "post_attention_layernorm.weight", (s.hidden,)),
            "q": (p + "self_attn.q_proj.weight", (s.q_dim, s.hidden)),
            "k": (p + "self_attn.k_proj.weight", (s.kv_dim, s.hidden)),
            "v": (p + "self_attn.v_proj.weight", (s.kv_dim, s.hidden)),
            "o": (p + "self_attn.o_proj.weight", (s.hidden, s.q_dim)),
            "gate": (p + "mlp.gate_proj.weight", (s.ffn, s.hidden)),
            "up": (p + "mlp.up_proj.weight", (s.ffn, s.hidden)),
            "down": (p + "mlp.down_proj.weight", (s.hidden, s.ffn)),
        }

    def global_tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        s = self.cfg.shapes
        out = {"embed": ("model.embed_tokens.weight", (s.vocab, s.hidden)),
               "final_norm": ("model.norm.weight", (s.hidden,))}
        if "lm_head.weight" in self.ckpt or not self.cfg.tie_embeddings:
            out["lm_head"] = ("lm_head.weight", (s.vocab, s.hidden))
        else:
            out["lm_head"] = out["embed"]
        return out

    def validate(self) -> None:
        """Every tensor present with the right shape and a readable byte range (header-only)."""
        wanted = list(self.global_tensors().values())
        for i in range(self.cfg.shapes.n_layers):
            wanted += self.layer_tensors(i).values()
        for name, shape in wanted:
            self.ckpt.get(name, shape)

    def layer(self, i: int) -> dict[str, np.ndarray]:
        return {k: self.ckpt.get(n, sh) for k, (n, sh) in self.layer_tensors(i).items()}

    # --- kernel layouts ---------------------------------------------------------------------------
    def embed(self) -> np.ndarray:
        n, sh = self.global_tensors()["embed"]
        return self.ckpt.get(n, sh)

    def final_norm(self) -> np.ndarray:
        n, sh = self.global_tensors()["final_norm"]
        return bf16(self.ckpt.get(n, sh))

    def prefill_statics(self, i: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(rms_gemms_rope statics without the LUT, o_ffn statics) for layer i, GEMM layout [in, out]."""
        w = self.layer(i)
        rgr = {"norm_w": bf16(w["attn_norm"]), "wq": transposed(w["q"]), "wk": transposed(w["k"]),
               "wv": transposed(w["v"])}
        off = {"wo": transposed(w["o"]), "ffn_norm_w": bf16(w["ffn_norm"]), "w_gate": transposed(w["gate"]),
               "w_up": transposed(w["up"]), "w_down": transposed(w["down"])}
        return rgr, off

    def decode_statics(self, i: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(rms_gemv_rope statics, o_gemv_ffn statics) for layer i, GEMV layout = HF [out, in]."""
        w = self.layer(i)
        rgr = {"norm_w": bf16(w["attn_norm"]), "wq": bf16(w["q"]), "wk": bf16(w["k"]), "wv": bf16(w["v"])}
        ogf = {"wo": bf16(w["o"]), "ffn_norm_w": bf16(w["ffn_norm"]), "w_gate": bf16(w["gate"]),
               "w_up": bf16(w["up"]), "w_down": bf16(w["down"])}
        return rgr, ogf

    def lm_head_partitions(self, n_parts: int, part_rows: int) -> dict[str, np.ndarray]:
        """{"w_0": [part_rows, H], ...}: vocab rows split in order; rows beyond vocab are zero."""
        n, sh = self.global_tensors()["lm_head"]
        w = self.ckpt.get(n, sh)
        vocab, hidden = sh
        if n_parts * part_rows < vocab:
            raise WeightsError(f"LM head plan {n_parts}x{part_rows} rows does not cover vocab {vocab}")
        parts = {}
        for p in range(n_parts):
            lo, hi = p * part_rows, min((p + 1) * part_rows, vocab)
            if hi - lo == part_rows:
                parts[f"w_{p}"] = bf16(w[lo:hi])
            else:
                buf = np.zeros((part_rows, hidden), dtype=BF16)
                if hi > lo:
                    buf[: hi - lo] = w[lo:hi]
                parts[f"w_{p}"] = buf
        return parts
