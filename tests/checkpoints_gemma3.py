"""A random-weight Gemma3ForCausalLM checkpoint (transformers' Gemma3TextConfig + save_pretrained) for the
Gemma 3 tests: bf16, std 0.02 projections, norm weights w ~ 0.1 N(0, 1) (Gemma multiplies by 1 + w, so a
dropped offset or a dropped norm cannot go unnoticed), with the WordLevel tokenizer of tests/checkpoints.py."""
from __future__ import annotations

from pathlib import Path

from checkpoints import write_tokenizer


def make_gemma3_checkpoint(out_dir: Path, *, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int,
                           vocab: int, layer_types: tuple[str, ...], sliding_window: int, query_pre_attn_scalar: int,
                           final_logit_softcapping: float | None = None, max_position: int = 512,
                           rope_local_theta: float = 10000.0, rope_theta: float = 1000000.0, seed: int = 0) -> Path:
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=len(layer_types),
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
        sliding_window=sliding_window, layer_types=list(layer_types), query_pre_attn_scalar=query_pre_attn_scalar,
        final_logit_softcapping=final_logit_softcapping, max_position_embeddings=max_position, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": rope_local_theta},
                         "full_attention": {"rope_type": "default", "rope_theta": rope_theta}},
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.02)
    with torch.no_grad():
        model = Gemma3ForCausalLM(cfg)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.1 * torch.randn_like(p))
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    write_tokenizer(out_dir, vocab)
    return out_dir
