"""4-bit weights from their sources into the q4 row format (kernel_builder.gemv_q4.format, docs/quantization.md):

- GGUF Q4_0 / Q4_1 blocks (group 32), read with the `gguf` package's GGUFReader: the 4-bit codes are copied
  exactly (re-ordered from GGUF's block order - element j in the low nibble of byte j, element j+16 in the high
  nibble - to ours); the f16 scale d (and Q4_1's f16 min m) become bf16 (RNE: the one rounding of the load,
  <= 2^-9 relative, the same rounding the bf16 path applies to every weight). Q4_0's w = d*(q - 8) is the
  symmetric format with signed codes q - 8 (exact), Q4_1's w = d*q + m the asymmetric one.
- GGUF Q8_0 tensors are kept in 8 bits where the model runs them so (the vocabulary matrix: the LM head's GEMVs
  on 8-bit codes, the tied embedding gathered from the same rows; codes exact, the f16 block scale -> bf16),
  else widened to bf16 (gguf's dequantize, one RNE rounding) like F16/F32/BF16 tensors. In the embedded SmolLM2
  GGUF that is the token embedding (tied LM head), a fifth of the weights.
- AWQ (GEMM packing) and GPTQ (v1, desc_act false) int4 safetensors, group 128 (HF `quantization_config`):
  codes exact, scales f16 -> bf16; AWQ's zero point z gives the min m = bf16(-s*z); GPTQ with sym=true and
  z = 8 is the symmetric format (exact codes q - 8).
- bf16 checkpoints quantized at load (`--weights q4`): format.quantize_rtn, group 32, asymmetric.

Rows of q_proj / k_proj in a GGUF are in llama.cpp's rotary order; they are permuted back exactly as
transformers' GGUF loader does (a row permutation: the packed rows move whole).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kernel_builder.gemv_q4.format import Q4Layout, dequantize, pack, unpack
from kernel_builder.numerics import BF16, to_bf16

from .errors import WeightsError

GGUF_GROUP = 32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)      # AutoAWQ GEMM: nibble i of an int32 holds output column AWQ_ORDER[i]


@dataclass(frozen=True)
class Q4Tensor:
    """A [rows, k] weight in the q4 row format."""
    packed: np.ndarray     # u8 [rows, row_bytes]
    k: int
    group: int
    mins: bool
    bits: int = 4          # 8: GGUF Q8_0 codes (one byte each)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.k)

    @property
    def layout(self) -> Q4Layout:
        return Q4Layout(self.k, self.group, self.mins, self.bits)

    def dequantize(self) -> np.ndarray:
        return dequantize(self.packed, self.k, self.group, self.mins, self.bits)

    def asymmetric(self) -> "Q4Tensor":
        """The same 4-bit weights with unsigned codes and mins: q + 8 and m = -8 d (exact: bf16 d times 8); 8-bit
        codes stay signed (their GEMV takes them so)."""
        if self.mins or self.bits == 8:
            return self
        codes, s, _ = unpack(self.packed, self.k, self.group, False)
        return Q4Tensor(pack(codes.astype(np.int16) + 8, s, -8 * s, self.group), self.k, self.group, True)

    def rows(self, order: np.ndarray) -> "Q4Tensor":
        return Q4Tensor(np.ascontiguousarray(self.packed[order]), self.k, self.group, self.mins, self.bits)


# ----------------------------------------------------------------------------------------------- GGUF
def from_gguf_blocks(raw: np.ndarray, qtype_name: str, rows: int, k: int, keep_q8: bool = False):
    """A Q4Tensor (Q4_0, Q4_1; Q8_0 with keep_q8, 8-bit codes) or a bf16 array (Q8_0, F16, F32, BF16) from a GGUF
    tensor's raw data."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    if qtype_name == "Q8_0" and keep_q8:     # block: f16 d, 32 x int8 q; w = d * q
        b = np.asarray(raw, dtype=np.uint8).reshape(rows, k // GGUF_GROUP, 34)
        d = np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[:, :, 0]
        q = np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(rows, k)
        return Q4Tensor(pack(q, d, None, GGUF_GROUP, bits=8), k, GGUF_GROUP, False, 8)
    if qtype_name in ("Q4_0", "Q4_1"):
        bsize = 18 if qtype_name == "Q4_0" else 20
        b = np.asarray(raw, dtype=np.uint8).reshape(rows, k // GGUF_GROUP, bsize)
        d = np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[:, :, 0]
        qs = b[:, :, bsize - 16:]
        codes = np.concatenate([qs & 0xF, qs >> 4], axis=2).astype(np.int16)    # element j, then j + 16
        if qtype_name == "Q4_0":
            return Q4Tensor(pack((codes - 8).reshape(rows, k), d, None, GGUF_GROUP), k, GGUF_GROUP, False)
        m = np.ascontiguousarray(b[:, :, 2:4]).view(np.float16)[:, :, 0]
        return Q4Tensor(pack(codes.reshape(rows, k), d, m, GGUF_GROUP), k, GGUF_GROUP, True)
    if qtype_name in ("Q8_0", "F16", "F32", "BF16"):
        w = gguf.quants.dequantize(np.asarray(raw), qtype)
        return to_bf16(np.asarray(w, dtype=np.float32).reshape(rows, k) if k else w)
    raise WeightsError(f"GGUF tensor type {qtype_name} is not supported (Q4_0, Q4_1, Q8_0, F16, F32, BF16 are)")


def unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """The row order transformers' GGUF loader applies to q_proj / k_proj (reverse of llama.cpp's permute)."""
    idx = np.arange(n_rows)
    dim = n_rows // n_head // 2
    return idx.reshape(n_head, dim, 2).swapaxes(2, 1).reshape(n_rows)


@functools.lru_cache(maxsize=4)
def _reader(path: str):
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.name: t for t in reader.tensors}


def _gguf_name(by_name: dict, hf: str):
    import gguf

    n_blocks = 1 + max((int(n.split(".")[1]) for n in by_name if n.startswith("blk.")), default=0)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    gname = tmap.get_name(hf[:-len(".weight")] if hf.endswith(".weight") else hf)
    return by_name.get(f"{gname}.weight") if gname else None


def gguf_tensor_type(path, hf_name: str) -> str | None:
    """The GGUF type name (Q4_1, Q8_0, F32, ...) of an HF tensor in a Llama GGUF, or None when absent."""
    t = _gguf_name(_reader(str(path)), hf_name)
    return t.tensor_type.name if t is not None else None


def gguf_tensors(path, hf_names, n_heads: int, n_kv_heads: int, keep_q8: bool = False) -> dict:
    """{HF name: Q4Tensor or bf16 array} for the requested HF tensor names of a Llama GGUF (Q8_0 tensors as 8-bit
    Q4Tensors with keep_q8, else bf16)."""
    import gguf

    by_name = _reader(str(path))
    n_blocks = 1 + max((int(n.split(".")[1]) for n in by_name if n.startswith("blk.")), default=0)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    out = {}
    for hf in hf_names:
        base = hf[:-len(".weight")] if hf.endswith(".weight") else hf
        gname = tmap.get_name(base)
        t = by_name.get(f"{gname}.weight") if gname else None
        if t is None:
            raise WeightsError(f"{path}: no GGUF tensor for {hf}")
        shape = [int(s) for s in t.shape]          # GGUF lists the fastest dimension first
        k, rows = (shape[0], int(np.prod(shape[1:]))) if len(shape) > 1 else (shape[0], 1)
        val = from_gguf_blocks(t.data, t.tensor_type.name, rows, k, keep_q8)
        if len(shape) == 1 and not isinstance(val, Q4Tensor):
            val = val.reshape(k)
        if ".self_attn.q_proj." in hf or ".self_attn.k_proj." in hf:
            order = unpermute_rows(rows, n_heads if ".q_proj." in hf else n_kv_heads)
            val = val.rows(order) if isinstance(val, Q4Tensor) else np.ascontiguousarray(val[order])
        out[hf] = val
    return out


# ----------------------------------------------------------------------------------------------- AWQ / GPTQ
def _nibbles(a: np.ndarray) -> np.ndarray:
    """int32 [..., n] -> uint8 [..., n, 8]: nibble i of each word (bits 4i..4i+3)."""
    u = np.asarray(a).astype(np.uint32)
    return ((u[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).astype(np.uint8)


def from_awq(qweight, qzeros, scales, group: int) -> Q4Tensor:
    """AutoAWQ GEMM: qweight int32 [in, out/8], qzeros int32 [in/G, out/8], scales f16 [in/G, out];
    w[out, in] = (q - z) * s."""
    inv = np.argsort(AWQ_ORDER)
    q = _nibbles(qweight)[..., inv].reshape(qweight.shape[0], -1).T       # [out, in]
    z = _nibbles(qzeros)[..., inv].reshape(qzeros.shape[0], -1).T.astype(np.float32)   # [out, in/G]
    s = to_bf16(np.asarray(scales, dtype=np.float32).T)
    m = -s.astype(np.float32) * z
    return Q4Tensor(pack(q, s, m, group), q.shape[1], group, True)


def from_gptq(qweight, qzeros, scales, group: int, sym: bool, g_idx=None) -> Q4Tensor:
    """GPTQ v1 (AutoGPTQ / optimum): qweight int32 [in/8, out] packed along the input, qzeros int32 [in/G, out/8]
    holding z - 1, scales f16 [in/G, out]; w = (q - z) * s. desc_act (a permuted g_idx) is not supported."""
    n_in = qweight.shape[0] * 8
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(n_in) // group):
        raise WeightsError("GPTQ with desc_act (permuted g_idx) is not supported")
    q = np.transpose(_nibbles(qweight), (0, 2, 1)).reshape(n_in, -1).T.astype(np.int16)   # [out, in]
    z = (_nibbles(qzeros).reshape(qzeros.shape[0], -1).T.astype(np.int16) + 1) & 0xF      # [out, in/G]
    s = to_bf16(np.asarray(scales, dtype=np.float32).T)
    if sym and np.all(z == 8):
        return Q4Tensor(pack(q - 8, s, None, group), n_in, group, False)
    m = -s.astype(np.float32) * z.astype(np.float32)
    return Q4Tensor(pack(q, s, m, group), n_in, group, True)


def checkpoint_quantization(raw: dict) -> dict | None:
    """config.json's `quantization_config` when it is a 4-bit AWQ/GPTQ one this loader reads (None when absent);
    WeightsError, one line, for any other."""
    qcfg = raw.get("quantization_config")
    if not qcfg:
        return None
    method, bits, group = qcfg.get("quant_method"), qcfg.get("bits"), qcfg.get("group_size")
    if method not in ("awq", "gptq"):
        raise WeightsError(f"quantization_config: quant_method {method!r} is not supported (awq, gptq)")
    if bits != 4 or group not in (32, 128):
        raise WeightsError(f"quantization_config: bits={bits}, group_size={group}: 4-bit with group 32 or 128 "
                           f"is supported")
    if method == "awq" and str(qcfg.get("version", "gemm")).lower() != "gemm":
        raise WeightsError(f"quantization_config: AWQ version {qcfg.get('version')!r} is not supported (gemm)")
    return qcfg


def check_quantized(ckpt, prefix: str, shape: tuple[int, int], qcfg: dict) -> None:
    """The int4 tensors of a [out, in] linear layer have the shapes qcfg's packing gives (headers only)."""
    n_out, n_in = shape
    g = int(qcfg["group_size"])
    if n_in % g or n_out % 8 or n_in % 8:
        raise WeightsError(f"{prefix}: [{n_out}, {n_in}] does not split into 8-code words and groups of {g}")
    packed = (n_in, n_out // 8) if qcfg["quant_method"] == "awq" else (n_in // 8, n_out)
    for name, want in (("qweight", packed), ("qzeros", (n_in // g, n_out // 8)), ("scales", (n_in // g, n_out))):
        ckpt.get(f"{prefix}.{name}", want)


def quantized_layer(ckpt, prefix: str, qcfg: dict) -> Q4Tensor:
    """The Q4Tensor of `prefix` (e.g. model.layers.0.self_attn.q_proj) in an AWQ / GPTQ checkpoint."""
    method, bits, group = qcfg.get("quant_method"), qcfg.get("bits"), qcfg.get("group_size")
    if bits != 4 or group not in (32, 128):
        raise WeightsError(f"quantization_config: bits={bits}, group_size={group}: 4-bit with group 32 or 128 "
                           f"is supported")
    qw, qz, sc = (np.asarray(ckpt.get(f"{prefix}.{n}")) for n in ("qweight", "qzeros", "scales"))
    if method == "awq":
        return from_awq(qw, qz, sc, group)
    if method == "gptq":
        g_idx = ckpt.get(f"{prefix}.g_idx") if f"{prefix}.g_idx" in ckpt else None
        return from_gptq(qw, qz, sc, group, bool(qcfg.get("sym", True)), g_idx)
    raise WeightsError(f"quantization_config: quant_method {method!r} is not supported (awq, gptq)")


def bf16_of(t) -> np.ndarray:
    return t.dequantize() if isinstance(t, Q4Tensor) else np.asarray(t, dtype=BF16)
