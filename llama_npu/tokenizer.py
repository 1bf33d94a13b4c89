"""Tokenizer from a HF model directory: BPE via the `tokenizers` library (tokenizer.json) and the
model's own chat template rendered with jinja2 (no transformers / torch at run time).

Only the chat template inserts control tokens: text that comes from a user or a tool and spells a special
token (e.g. "<|im_end|>") is encoded as plain text by `encode` and `apply_chat_template`, so no message can
forge a turn; `parse_special=True` (`llama-npu run --raw`) is the explicit opt-in to parse it.
"""
from __future__ import annotations

import json
import re
import secrets
import threading
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


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise TokenizerError(f"{path}: {what} is not valid JSON ({why})") from None


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
            if name.endswith(".json"):
                data = _read_json(path, "the chat template file")
                text = data.get("chat_template") if isinstance(data, dict) else None
                if not isinstance(text, str):
                    raise TokenizerError(f"{path}: expected a JSON object with a \"chat_template\" string")
            else:
                try:
                    text = path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    raise TokenizerError(f"{path}: the chat template is not UTF-8 text") from None
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
        self.config: dict = _read_json(cfg_path, "tokenizer_config.json") if cfg_path.is_file() else {}
        if not isinstance(self.config, dict):
            raise TokenizerError(f"{cfg_path}: tokenizer_config.json is not a JSON object")
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
        self.special_texts: tuple[str, ...] = tuple(sorted(added))   # texts that are control tokens
        self._text_tok = None    # the same tokenizer with special tokens encoded as text (built on first use)
        self._text_lock = threading.Lock()
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

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. Special-token spellings in it are plain text unless `parse_special` (the
        `--raw` opt-in); `add_special_tokens` adds what the tokenizer's post-processor adds (e.g. BOS)."""
        if parse_special or not any(t in text for t in self.special_texts):
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if not add_special_tokens:
            return self._plain_ids(text)
        # what the post-processor adds around any text (e.g. BOS before it), found around a probe
        probe, bare = (self._tok.encode("a", add_special_tokens=flag).ids for flag in (True, False))
        at = next((i for i in range(len(probe) - len(bare) + 1) if probe[i:i + len(bare)] == bare), 0)
        return probe[:at] + self._plain_ids(text) + probe[at + len(bare):]

    def _plain_ids(self, text: str) -> list[int]:
        """Ids of `text` with every special-token spelling as text. The tokenizer's own split of such text is
        used unless its model maps the spelling back to a control id (a word-level vocabulary holding "</s>"):
        then each spelling is cut after its first character and the pieces are encoded apart."""
        control = self._control_ids()
        ids = self._plain().encode(text, add_special_tokens=False).ids
        if not control.intersection(ids):
            return ids
        ids = []
        pattern = "|".join(re.escape(t) for t in sorted(self.special_texts, key=len, reverse=True))
        for piece in re.split(f"({pattern})", text):
            parts = (piece[:1], piece[1:]) if piece in self.special_texts else (piece,)
            for part in parts:
                if part:
                    ids += self._plain().encode(part, add_special_tokens=False).ids
        if control.intersection(ids):
            raise TokenizerError(f"{self.model_dir}: this tokenizer maps special-token text to control tokens "
                                 f"even as plain text; use --raw to pass such text on purpose")
        return ids

    def _control_ids(self) -> frozenset:
        """Ids of the special tokens that steer the model (the unknown-token id is what unknown text becomes)."""
        unk = self.special.get("unk_token")
        return frozenset(self._tok.token_to_id(t) for t in self.special_texts if t != unk)

    def _plain(self):
        """The tokenizer with `encode_special_tokens` set: special-token spellings are split as text."""
        with self._text_lock:
            if self._text_tok is None:
                from tokenizers import Tokenizer as HFTokenizer

                tok = HFTokenizer.from_file(str(self.model_dir / "tokenizer.json"))
                tok.encode_special_tokens = True
                self._text_tok = tok
        return self._text_tok

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
                            tools: list | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of the rendered conversation. Control tokens come from the template only (none are added
        on top, as transformers does): message and tool text that spells a special token is encoded as plain
        text (unless `parse_special`). Such text is rendered between two random markers, so the template's own
        text and the message text are tokenized apart; without such text the rendering is encoded whole."""
        if parse_special or not _spells_special([messages, tools], self.special_texts):
            return self._tok.encode(self.render_chat(messages, add_generation_prompt, tools),
                                    add_special_tokens=False).ids
        nonce = secrets.token_hex(8)
        start, end = f"\ue000{nonce}\ue001", f"\ue002{nonce}\ue001"
        marked_tools = _mark(tools, start, end, self.special_texts) if tools else tools
        text = self.render_chat(_mark(messages, start, end, self.special_texts), add_generation_prompt, marked_tools)
        if text.replace(start, "").replace(end, "") != self.render_chat(messages, add_generation_prompt, tools):
            raise TokenizerError(f"{self.model_dir}: the chat template changes a message that spells a special "
                                 f"token, so its text cannot be kept apart from the template's control tokens")
        ids, pos = [], 0
        for m in re.finditer(re.escape(start) + "(.*?)" + re.escape(end), text, re.S):
            ids += self._tok.encode(text[pos:m.start()], add_special_tokens=False).ids
            ids += self._plain_ids(m.group(1))
            pos = m.end()
        ids += self._tok.encode(text[pos:], add_special_tokens=False).ids
        return ids


def _spells_special(value, specials: tuple[str, ...]) -> bool:
    """True when a string anywhere in the messages (roles excepted) contains a special token's text."""
    if isinstance(value, str):
        return any(t in value for t in specials)
    if isinstance(value, dict):
        return any(_spells_special(v, specials) for k, v in value.items() if k != "role")
    if isinstance(value, (list, tuple)):
        return any(_spells_special(v, specials) for v in value)
    return False


def _mark(value, start: str, end: str, specials: tuple[str, ...]):
    """A copy of the messages with every string that spells a special token wrapped in start/end markers."""
    if isinstance(value, str):
        return start + value + end if any(t in value for t in specials) else value
    if isinstance(value, dict):
        return {k: v if k == "role" else _mark(v, start, end, specials) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(v, start, end, specials) for v in value]
    return value
