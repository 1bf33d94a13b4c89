"""Tokenizer from a HF model directory: BPE via the `tokenizers` library (tokenizer.json) and the
model's own chat template rendered with jinja2 (no transformers / torch at run time)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from .errors import TokenizerError

# Markers that end an assistant turn in the common Llama-family chat formats; used as extra stop ids
# when present in the vocabulary as special tokens (generation_config often lists only one EOS).
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>",
                      "</s>", "<end_of_turn>")


def _token_str(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _load_template(model_dir: Path, tok_cfg: dict) -> str | None:
    tpl = tok_cfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    if isinstance(tpl, str) and tpl.strip():
        return tpl
    for name in ("chat_template.jinja", "chat_template.json"):
        path = model_dir / name
        if path.is_file():
            text = path.read_text()
            if name.endswith(".json"):
                text = json.loads(text).get("chat_template", "")
            if text.strip():
                return text
    return None


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        self.model_dir = Path(model_dir)
        tok_json = self.model_dir / "tokenizer.json"
        if not tok_json.is_file():
            raise TokenizerError(f"{self.model_dir}: no tokenizer.json (a fast HF tokenizer is required)")
        try:
            self._tok = HFTokenizer.from_file(str(tok_json))
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise TokenizerError(f"{tok_json}: cannot load tokenizer ({str(e).splitlines()[0]})") from None
        cfg_path = self.model_dir / "tokenizer_config.json"
        try:
            self.config: dict = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        except json.JSONDecodeError as e:
            raise TokenizerError(f"{cfg_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        self.chat_template = _load_template(self.model_dir, self.config)
        self.special: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            s = _token_str(self.config.get(key))
            if s is not None:
                self.special[key] = s
        ids = []
        eos = self.special.get("eos_token")
        if eos is not None and self._tok.token_to_id(eos) is not None:
            ids.append(self._tok.token_to_id(eos))
        added = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        ids += [self._tok.token_to_id(t) for t in END_OF_TURN_TOKENS if t in added]
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None) -> str:
        if self.chat_template is None:
            raise TokenizerError(f"{self.model_dir}: the tokenizer has no chat template (use --raw)")
        from jinja2.exceptions import TemplateError

        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent, ensure_ascii=False)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                self._template = env.from_string(self.chat_template)
            except TemplateError as e:
                raise TokenizerError(f"{self.model_dir}: cannot parse the chat template ({e})") from None
        try:
            extra = {"tools": tools} if tools else {}  # OpenAI-shaped tool list, as transformers passes it
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **extra, **self.special)
        except TemplateError as e:  # e.g. the template's raise_exception("roles must alternate ...")
            raise TokenizerError(f"{self.model_dir}: the chat template rejected the conversation ({e})") from None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list | None = None) -> list[int]:
        """Token ids of the rendered conversation (special tokens come from the template itself, so
        none are added on top, as transformers does)."""
        return self.encode(self.render_chat(messages, add_generation_prompt, tools), add_special_tokens=False)
