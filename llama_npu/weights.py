"""Safetensors checkpoints: headers validated before any weight is read; tensors read straight from the
file into the device buffers that hold them (no second host copy: the reference design's "the BO IS the
weight storage"), as each static argument's TensorSpec says (projection weights: the HF [out, in] tensor as stored, one buffer
for prefill and decode; LM-head partitions: row blocks zero-padded past the vocabulary).
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
from .models.lowering import BFP_SUFFIX

_DTYPES = {"BF16": BF16, "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
           "I32": np.dtype(np.int32)}   # I32: AWQ/GPTQ packed 4-bit codes (llama_npu.quant)
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

    def read_into(self, name: str, view: np.ndarray, start: int, count: int) -> None:
        """Elements [start, start + count) of a tensor, as bf16, into `view` (a uint8 array of count*2
        bytes). bf16 tensors are read from the file straight into it; others are converted (RNE) on the way."""
        ref = self.refs[name]
        dtype = _DTYPES.get(ref.dtype)
        if dtype is None:
            raise WeightsError(f"{ref.file.name}: tensor {name} has unsupported dtype {ref.dtype}")
        if view.nbytes != count * 2:
            raise WeightsError(f"tensor {name}: {count} elements do not fill a {view.nbytes}-byte buffer")
        if dtype == BF16:
            with open(ref.file, "rb") as f:
                f.seek(ref.start + start * 2)
                if f.readinto(memoryview(view)) != view.nbytes:
                    raise WeightsError(f"{ref.file.name}: tensor {name} is truncated")
            return
        flat = self.get(name).reshape(-1)[start:start + count]
        np.copyto(view.view(BF16), to_bf16(flat))

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


class ModelWeights:
    """The checkpoint behind a model description's tensor map: validated up front (headers only), read
    tensor by tensor straight into device buffers (`writer`), the embedding kept as a mapped view."""

    def __init__(self, cfg: ModelConfig, model=None, checkpoint: Checkpoint | None = None, weights: str = "bf16",
                 gguf: Path | None = None):
        from .models import model_for

        self.cfg = cfg
        self.model = model or model_for(cfg, weights)
        self.ckpt = checkpoint or Checkpoint(cfg.model_dir)
        # q4: the 4-bit weights come from `gguf` (its Q4_0/Q4_1 blocks, exactly) or are quantized at load (RTN)
        untied = "lm_head.weight" in self.ckpt or not cfg.tie_embeddings
        self.lm_source = "lm_head" if untied else "embed"
        self.model.tied = not untied
        from .quant import checkpoint_quantization
        self.qcfg = checkpoint_quantization(cfg.raw or {})    # an AWQ / GPTQ int4 checkpoint
        if self.qcfg and self.model.weights != "q4":
            raise WeightsError(f"{cfg.model_dir.name}: the checkpoint is {self.qcfg['quant_method']} 4-bit; run it "
                               f"with --weights q4 (WEIGHTS=q4)")
        self.q4 = Q4Source(self, gguf) if self.model.weights == "q4" else None
        if self.q4 is not None:
            self.model.head_weights = self.q4.head_format()
        self.validate()

    def validate(self) -> None:
        """Every tensor the model needs is present with the right shape and a readable byte range."""
        s = self.cfg.shapes
        wanted = [("model.embed_tokens.weight", (s.vocab, s.hidden)), ("model.norm.weight", (s.hidden,))]
        if self.lm_source == "lm_head":
            wanted.append(("lm_head.weight", (s.vocab, s.hidden)))
        for i in range(s.n_layers):
            wanted += [(f"model.layers.{i}.{hf}", shape) for hf, shape in self.model.checkpoint_tensors()]
        for name, shape in wanted:
            if self.qcfg and len(shape) == 2 and name.startswith("model.layers."):
                from .quant import check_quantized
                check_quantized(self.ckpt, name.removesuffix(".weight"), shape, self.qcfg)
            else:
                self.ckpt.get(name, shape)

    def embed(self):
        """The embedding rows the host gathers: the checkpoint's; with a 4-bit tied LM head, that head's rows
        dequantized (the one copy of the tied matrix)."""
        s = self.cfg.shapes
        if self.q4 is not None and self.model.head_weights in ("q4", "q8") and self.lm_source == "embed":
            return self.q4.vocab_rows()
        rows = self.ckpt.get("model.embed_tokens.weight", (s.vocab, s.hidden))
        if self.q4 is not None and self.lm_source == "lm_head":     # untied, 4-bit: the rows the device holds
            from .models.lowering import Q4_GROUP
            return Q4EmbedRows(rows, Q4_GROUP)
        return rows

    def spec(self, arg: str, layer: int | None):
        return self.model.static_tensor(arg, layer, self.lm_source)

    def writer(self, arg: str, layer: int | None):
        """`fill(view)` for ModuleExecutor.write_static: the bytes of static `arg` of `layer` (None: LM head),
        in the layout its name asks for, written into `view` (the device buffer's host mapping)."""
        spec = self.spec(arg, layer)
        if self.q4 is not None and layer is not None and arg.endswith("_q4"):
            return self.q4.writer(spec)
        if self.q4 is not None and arg.endswith(("_q4", "_q8")):     # an LM-head partition in 4 or 8 bits
            return self.q4.head_writer(spec)
        if arg.endswith(BFP_SUFFIX):          # a weight at rest in block float: its bf16 rows, encoded once here
            return lambda view: _fill_bfp(self.ckpt, spec, view)
        return lambda view: _fill_bf16(self.ckpt, spec, view)


class Q4Source:
    """The 4-bit layer weights of a q4 run (docs/quantization.md): from a GGUF's Q4_0/Q4_1 blocks (codes exact,
    scales/mins rounded to bf16; a Q4_0 tensor in the asymmetric form), from an AWQ / GPTQ checkpoint's int4
    tensors (codes exact) or round-to-nearest per group of 32 from the bf16 checkpoint. The device holds these
    rows only: decode GEMVs read them, prefill GEMMs read their dequantization made on the device per layer."""

    def __init__(self, weights: "ModelWeights", gguf: Path | None):
        self.weights, self.gguf = weights, gguf
        self._last = (None, None)
        self._vocab_t = None

    def tensor(self, name: str):
        if self._last[0] != name:       # a fused tensor (Phi-3's qkv / gate_up) is asked for once per part
            self._last = (name, self._load(name))
        return self._last[1]

    def _load(self, name: str):
        from kernel_builder.gemv_q4.format import quantize_rtn

        from .quant import Q4Tensor, gguf_tensors, quantized_layer

        w = self.weights
        if self.gguf is not None:
            s = w.cfg.shapes
            t = gguf_tensors(self.gguf, [name], s.n_heads, s.n_kv_heads)[name]
            if not isinstance(t, Q4Tensor) or t.group != 32:
                raise WeightsError(f"{self.gguf.name}: tensor {name} is not Q4_0/Q4_1 (group 32); "
                                   f"--weights q4 runs 4-bit GGUF layers only")
            return t.asymmetric()
        if w.qcfg:
            return quantized_layer(w.ckpt, name.removesuffix(".weight"), w.qcfg).asymmetric()
        a = w.ckpt.get(name)
        return Q4Tensor(quantize_rtn(a, 32), a.shape[1], 32, True)

    def writer(self, spec):
        """The q4 rows of `spec`'s tensor; with `spec.index`, those rows in that order (Phi-3's fused q/k/v and
        gate/up parts, the partial-rotary q/k order: a row permutation moves whole packed rows, exactly)."""
        def fill(view: np.ndarray) -> None:
            t = self.tensor(spec.name)
            if t.shape[0] != spec.shape[0] or t.k != spec.shape[1]:
                raise WeightsError(f"{spec.name}: 4-bit tensor of shape {list(t.shape)}, expected "
                                   f"{list(spec.shape)}")
            packed = t.packed[np.asarray(spec.index, dtype=np.int64)] if spec.index else t.packed
            if packed.nbytes != view.nbytes:
                raise WeightsError(f"{spec.name}: {packed.nbytes} bytes of q4 rows (group {t.group}) do not fill "
                                   f"its {view.nbytes}-byte device buffer")
            np.copyto(view, np.ascontiguousarray(packed).reshape(view.shape))
        return fill

    # ------------------------------------------------------------------------------------------- LM head
    def head_format(self) -> str:
        """The LM head's weights as the source keeps them (no requantization): q4 always for RTN; for a GGUF q4
        when its LM-head tensor (or tied embedding) is Q4_0/Q4_1, q8 when Q8_0, else bf16; AWQ / GPTQ: bf16."""
        if self.weights.qcfg:
            return "bf16"           # AWQ / GPTQ keep the LM head in 16 bits
        if self.gguf is None:
            return "q4"
        from .quant import gguf_tensor_type
        name = "lm_head.weight" if self.weights.lm_source == "lm_head" else "model.embed_tokens.weight"
        kind = gguf_tensor_type(self.gguf, name)
        return "q4" if kind in ("Q4_0", "Q4_1") else "q8" if kind == "Q8_0" else "bf16"

    def _vocab(self):
        if self._vocab_t is None:
            w = self.weights
            name = "lm_head.weight" if w.lm_source == "lm_head" else "model.embed_tokens.weight"
            if self.gguf is not None:
                from .quant import gguf_tensors
                s = w.cfg.shapes
                self._vocab_t = gguf_tensors(self.gguf, [name], s.n_heads, s.n_kv_heads, keep_q8=True)[name]
            else:
                from kernel_builder.gemv_q4.format import quantize_rtn

                from .quant import Q4Tensor
                a = w.ckpt.get(name)
                self._vocab_t = Q4Tensor(quantize_rtn(a, 32), a.shape[1], 32, True)
            if hasattr(self._vocab_t, "asymmetric"):
                self._vocab_t = self._vocab_t.asymmetric()
        return self._vocab_t

    def vocab_rows(self):
        return DequantRows(self._vocab())

    def head_writer(self, spec):
        def fill(view: np.ndarray) -> None:
            packed = self._vocab().packed
            lo, hi = spec.row0, min(spec.row0 + spec.rows, packed.shape[0])
            rows = np.zeros((spec.rows, packed.shape[1]), dtype=np.uint8)   # zero rows past the vocabulary
            rows[:max(0, hi - lo)] = packed[lo:hi]
            np.copyto(view, rows.reshape(view.shape))
        return fill


class DequantRows:
    """`rows[ids]` of a Q4Tensor as bf16 (the embedding gather of a 4-bit tied LM head)."""

    def __init__(self, t):
        self.t = t

    def __getitem__(self, idx):
        ids = np.atleast_1d(np.asarray(idx))
        from kernel_builder.gemv_q4.format import dequantize
        out = dequantize(self.t.packed[ids], self.t.k, self.t.group, self.t.mins, self.t.bits)
        return out[0] if np.ndim(idx) == 0 else out


class Q4EmbedRows:
    """An untied model's embedding in a 4-bit run (models.token.embed_q4): each row rounded to nearest per group
    of `group` with mins (format.quantize_rtn, row by row, so any gather gives the same codes). `rows[ids]` is
    their bf16 dequantization (the host's gather: prefill and the per-layer decode); `packed(ids)` the q4 rows the
    token modules' EMBED state holds (dequantized on the core to the same bf16 values)."""

    def __init__(self, src, group: int):
        self.src, self.group = src, group
        self.shape = src.shape

    def packed(self, ids) -> np.ndarray:
        from kernel_builder.gemv_q4.format import quantize_rtn
        return quantize_rtn(np.asarray(self.src[np.atleast_1d(np.asarray(ids))], dtype=np.float32), self.group)

    def __getitem__(self, idx):
        from kernel_builder.gemv_q4.format import dequantize
        out = dequantize(self.packed(idx), self.shape[1], self.group, True)
        return out[0] if np.ndim(idx) == 0 else out


def _fill_bf16(ckpt: Checkpoint, spec, view: np.ndarray) -> None:
    """The bf16 bytes of `spec` (a tensor, some of its rows in a given order, or a zero-padded block of rows)."""
    if spec.index:                    # rows of a (fused) tensor, in the order the description asks
        _gather_rows(ckpt, spec, view)
    elif spec.rows:                   # a block of rows, zero-padded past the tensor's end
        hidden = spec.shape[1]
        lo, hi = spec.row0, min(spec.row0 + spec.rows, spec.shape[0])
        n = max(0, hi - lo) * hidden * 2
        if n:
            ckpt.read_into(spec.name, view[:n], lo * hidden, (hi - lo) * hidden)
        view[n:] = 0
    else:
        ckpt.read_into(spec.name, view, 0, int(np.prod(spec.shape)))


def _fill_bfp(ckpt: Checkpoint, spec, view: np.ndarray) -> None:
    """`spec`'s rows at rest in block float (kernel_builder/block_float.py): read as bf16 like `_fill_bf16`, then
    encoded into `view` (bytes [rows/8, 9 * cols])."""
    from kernel_builder import block_float

    rows = len(spec.index) if spec.index else spec.rows or spec.shape[0]
    cols = int(np.prod(spec.shape[1:], dtype=np.int64))
    if view.nbytes != rows * cols * block_float.GROUP_BYTES // block_float.BLOCK:
        raise WeightsError(f"{spec.name}: a {view.nbytes}-byte buffer for {rows} x {cols} weights in block float")
    tmp = np.empty(rows * cols * 2, dtype=np.uint8)
    _fill_bf16(ckpt, spec, tmp)
    np.copyto(view.reshape(-1), block_float.encode(tmp.view(BF16).reshape(rows, cols)).reshape(-1))


def _gather_rows(ckpt: Checkpoint, spec, view: np.ndarray) -> None:
    """Rows `spec.index` of the stored tensor (of the row concatenation of `spec.parts`, when set: the gate and up
    weights interleaved into one) into `view`: one read when they are consecutive (a part of a fused projection),
    else a gather (the partial-rotary q/k order, the interleave)."""
    cols = int(np.prod(spec.shape[1:], dtype=np.int64)) if len(spec.shape) > 1 else 1
    idx = np.asarray(spec.index, dtype=np.int64)
    if spec.parts:
        rows = np.concatenate([ckpt.get(name, spec.shape).reshape(spec.shape[0], cols) for name in spec.parts])
        np.copyto(view.view(BF16).reshape(idx.size, cols), bf16(rows[idx]))
        return
    if np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        ckpt.read_into(spec.name, view, int(idx[0]) * cols, idx.size * cols)
        return
    rows = ckpt.get(spec.name, spec.shape).reshape(spec.shape[0], cols)[idx]
    np.copyto(view.view(BF16).reshape(idx.size, cols), bf16(rows))
