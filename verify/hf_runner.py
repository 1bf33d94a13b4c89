"""The reference side: HF transformers, bf16, CPU, SDPA attention (transformers' default for Llama), greedy
decode with a KV cache. (Eager attention materialises the bf16 score matrix: the 6,169-token verify prompt
took over half an hour on 2 cores with it, a few minutes with SDPA.)

Determinism: a fixed torch thread count (reductions split the same way on every run) and a fixed seed
(nothing here samples, but the seed makes any stray randomness reproducible). Inputs are token ids from
OUR tokenizer, so both sides see identical prompts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

HF_ATTN = "sdpa"   # recorded in the report's settings

from .gate import Trace, greedy_token, topk_ids

INSTALL_HINT = "pip install 'llama-npu[verify]'  (or: make setup)"
DEFAULT_THREADS = 1  # one thread: reproducible, and no spin-waiting fight with the emulator's BLAS threads
DEFAULT_SEED = 0


class ReferenceUnavailable(RuntimeError):
    """The HF reference cannot run (torch/transformers missing, or the model does not load); exit code 2."""


def import_reference_stack():
    """Import torch + transformers, or raise ReferenceUnavailable naming the install command."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ReferenceUnavailable(
            f"the HF reference needs torch and transformers ({e.name or e} is not installed); "
            f"install them with: {INSTALL_HINT}") from None
    return torch, transformers


class HFReference:
    def __init__(self, model, torch_mod, model_dir: Path):
        self.model = model
        self.torch = torch_mod
        self.model_dir = model_dir

    @classmethod
    def load(cls, model_dir: str | Path, threads: int = DEFAULT_THREADS, seed: int = DEFAULT_SEED) -> "HFReference":
        torch, transformers = import_reference_stack()
        model_dir = Path(model_dir)
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        if not (model_dir / "config.json").is_file():
            raise ReferenceUnavailable(f"HF transformers cannot load {model_dir}: no config.json there "
                                       "(the reference needs a Hugging Face model directory)")
        # transformers >= 4.56 calls the dtype argument `dtype`; older releases only know `torch_dtype`.
        version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
        dtype_kw = "dtype" if version >= (4, 56) else "torch_dtype"
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(model_dir), attn_implementation=HF_ATTN, **{dtype_kw: torch.bfloat16})
        except Exception as e:  # any loader failure (incl. safetensors' own error types) means "cannot run"
            first = (str(e).strip().splitlines() or [""])[0]
            raise ReferenceUnavailable(
                f"HF transformers cannot load the model at {model_dir}: {type(e).__name__}: {first}") from None
        model = model.to("cpu").eval()
        return cls(model, torch, model_dir)

    @property
    def n_layers(self) -> int:
        return len(self._decoder_layers())

    def _decoder_layers(self):
        inner = getattr(self.model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise ReferenceUnavailable(f"{type(self.model).__name__} has no model.layers (not a Llama-family model)")
        return layers

    def greedy(self, token_ids: list[int], n_tokens: int, k: int, eos_ids=()) -> Trace:
        """Greedy-decode n_tokens (stopping after an EOS id), recording top-k ids per step.

        Step 0 scores the prompt's last position; step s feeds the token chosen at step s-1 through the cache.
        """
        torch = self.torch
        eos = {int(e) for e in eos_ids}
        tokens: list[int] = []
        topk: list[tuple[int, ...]] = []
        finite = True
        stop = "length"
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([token_ids], dtype=torch.long), use_cache=True)
            for step in range(n_tokens):
                logits = out.logits[0, -1].float().numpy()
                finite &= bool(np.isfinite(logits).all())
                tok = greedy_token(logits)
                tokens.append(tok)
                topk.append(topk_ids(logits, k))
                if tok in eos:
                    stop = "eos"
                    break
                if step + 1 < n_tokens:
                    out = self.model(input_ids=torch.tensor([[tok]], dtype=torch.long),
                                     past_key_values=out.past_key_values, use_cache=True)
        return Trace(tokens, topk, stop=stop, finite=finite)

    def layer_outputs(self, token_ids: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Prefill once; return (per-layer decoder-layer outputs captured by forward hooks,
        `output_hidden_states` entries 1..n), each f32 [prompt_len, hidden].

        The hooks see every layer's raw residual-stream output. `hidden_states[i+1]` equals layer i's output
        for i < n-1, but LlamaModel appends the LAST entry after the final RMSNorm, so it is not layer n-1's
        output; diagnosis compares against the hook values and keeps the other list only as a cross-check.
        """
        torch = self.torch
        captured: list[np.ndarray | None] = [None] * self.n_layers

        def hook_for(i):
            def hook(_module, _inputs, output):
                h = output[0] if isinstance(output, (tuple, list)) else output
                captured[i] = h[0].float().numpy().copy()
            return hook

        handles = [layer.register_forward_hook(hook_for(i)) for i, layer in enumerate(self._decoder_layers())]
        try:
            with torch.inference_mode():
                out = self.model(input_ids=torch.tensor([token_ids], dtype=torch.long),
                                 use_cache=False, output_hidden_states=True)
        finally:
            for h in handles:
                h.remove()
        if any(c is None for c in captured):
            raise RuntimeError("a decoder-layer hook did not fire; cannot read per-layer outputs")
        hs = [h[0].float().numpy() for h in out.hidden_states[1:]]
        return captured, hs
