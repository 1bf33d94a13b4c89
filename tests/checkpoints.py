"""Small Llama-family checkpoints for the runtime tests.

`make_hf_checkpoint` builds a random-weight LlamaForCausalLM with transformers/torch (bf16, std 0.02 init,
perturbed norm weights so a dropped norm weight cannot go unnoticed) and saves it with save_pretrained;
`write_numpy_checkpoint` writes a tiny checkpoint without torch (for CLI error tests). Both add a small
WordLevel tokenizer with a chat template.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from kernel_builder.numerics import BF16

SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
WORDS = ("the a of to and in is what capital france paris city river name hello world you are "
         "helpful assistant tell me about one two three four five six seven eight nine ten").split()
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {{ eos_token }} "
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")


def write_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """WordLevel tokenizer: specials, English words, then w<i> fillers up to min(vocab_size, 512)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    i = 0
    while len(vocab) < min(vocab_size, 512):
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}))


def make_hf_checkpoint(out_dir: Path, *, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int,
                       n_layers: int, vocab: int, max_position: int = 4096, rope_theta: float = 500000.0,
                       rope_scaling: dict | None = None, tie: bool = False, seed: int = 0,
                       arch: str = "llama", **extra) -> Path:
    """arch "llama" (LlamaForCausalLM), "qwen3" (Qwen3ForCausalLM: per-head q/k RMSNorm), "qwen2", "mistral",
    "phi3" (their XxxConfig / XxxForCausalLM); `extra` goes to the config (sliding_window, partial_rotary_factor,
    original_max_position_embeddings, ...). Biases (Qwen2) get std 0.5, so a dropped bias changes the result."""
    import torch
    import transformers

    names = {"llama": "Llama", "qwen3": "Qwen3", "qwen2": "Qwen2", "mistral": "Mistral", "phi3": "Phi3"}[arch]
    config_cls = getattr(transformers, f"{names}Config")
    model_cls = getattr(transformers, f"{names}ForCausalLM")
    kwargs = dict(extra)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    cfg = config_cls(hidden_size=hidden, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                     head_dim=head_dim, intermediate_size=ffn, num_hidden_layers=n_layers, vocab_size=vocab,
                     max_position_embeddings=max_position, rope_theta=rope_theta, rms_norm_eps=1e-5,
                     tie_word_embeddings=tie, initializer_range=0.02, bos_token_id=1, eos_token_id=2,
                     **kwargs)
    with torch.no_grad():
        model = model_cls(cfg)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    write_tokenizer(out_dir, vocab)
    return out_dir


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Minimal safetensors writer (bf16/f32/f16/i32), so tests can build and damage files without torch."""
    names = {np.dtype(BF16): "BF16", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.int32): "I32"}
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def write_numpy_checkpoint(out_dir: Path, *, hidden: int = 256, n_heads: int = 4, n_kv_heads: int = 2,
                           ffn: int = 512, n_layers: int = 1, vocab: int = 512, max_position: int = 256,
                           seed: int = 0, config_overrides: dict | None = None, tied: bool = True) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hd = hidden // n_heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads, "head_dim": hd,
           "intermediate_size": ffn, "num_hidden_layers": n_layers, "vocab_size": vocab,
           "max_position_embeddings": max_position, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "hidden_act": "silu", "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(config_overrides or {})
    (out_dir / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(BF16)

    t = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": np.ones(hidden, BF16)}
    if not tied:
        t["lm_head.weight"] = w(vocab, hidden)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": np.ones(hidden, BF16),
                  p + "post_attention_layernorm.weight": np.ones(hidden, BF16),
                  p + "self_attn.q_proj.weight": w(n_heads * hd, hidden),
                  p + "self_attn.k_proj.weight": w(n_kv_heads * hd, hidden),
                  p + "self_attn.v_proj.weight": w(n_kv_heads * hd, hidden),
                  p + "self_attn.o_proj.weight": w(hidden, n_heads * hd),
                  p + "mlp.gate_proj.weight": w(ffn, hidden),
                  p + "mlp.up_proj.weight": w(ffn, hidden),
                  p + "mlp.down_proj.weight": w(hidden, ffn)})
    write_safetensors(out_dir / "model.safetensors", t)
    write_tokenizer(out_dir, vocab)
    return out_dir


def block_float_copy(src: Path, dst: Path) -> Path:
    """A copy of checkpoint `src` at `dst` with every layer matrix replaced by its block-float values
    (kernel_builder/block_float.py: what `--weights bfp16` keeps); the embedding / LM head and vectors as they are."""
    import shutil

    from kernel_builder import block_float
    from llama_npu.weights import Checkpoint
    shutil.copytree(src, dst)
    ck = Checkpoint(src)
    t = {}
    for n in ck.refs:
        a = np.array(ck.get(n))
        if a.ndim == 2 and n.startswith("model.layers."):
            a = block_float.quantize(a.astype(np.float32)).astype(a.dtype)
        t[n] = a
    for f in dst.glob("*.safetensors"):
        f.unlink()
    write_safetensors(dst / "model.safetensors", t)
    return dst
