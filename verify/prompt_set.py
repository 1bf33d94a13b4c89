"""The verify prompts: one JSON file per prompt in verify/prompts/ ({"name", "prompt", "chat", "quick"?,
"prompt_file"?: a text file next to it placed before the prompt, for long-context prompts})."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    chat: bool        # True: wrapped in the model's chat template (user turn + generation prompt)
    quick: bool = False  # member of the quick subset `make verify` runs

    def token_ids(self, tokenizer) -> list[int]:
        """Token ids fed to BOTH sides (our tokenizer's ids, so the inputs are identical)."""
        if self.chat:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": self.text}],
                                                add_generation_prompt=True)
        else:
            ids = tokenizer.encode(self.text, add_special_tokens=True)
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError(f"prompt {self.name!r} tokenized to zero tokens")
        return ids


def load_prompt_file(path: Path) -> Prompt:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object with name/prompt/chat")
    missing = [k for k in ("name", "prompt", "chat") if k not in d]
    if missing:
        raise ValueError(f"{path}: missing field(s) {missing}")
    if not isinstance(d["prompt"], str) or not d["prompt"]:
        raise ValueError(f"{path}: 'prompt' must be a non-empty string")
    if not isinstance(d["chat"], bool):
        raise ValueError(f"{path}: 'chat' must be true or false")
    text = d["prompt"]
    if "prompt_file" in d:   # a long document next to the JSON file, placed before the prompt
        doc = path.parent / str(d["prompt_file"])
        if not doc.is_file():
            raise ValueError(f"{path}: prompt_file {d['prompt_file']!r} does not exist next to it")
        text = doc.read_text(encoding="utf-8") + text
    return Prompt(str(d["name"]), text, d["chat"], bool(d.get("quick", False)))


def load_prompts(directory: Path | str | None = None, full: bool = True) -> list[Prompt]:
    """All prompts of a directory in file-name order; only the `quick` ones unless full."""
    directory = Path(directory) if directory is not None else PROMPTS_DIR
    if not directory.is_dir():
        raise ValueError(f"prompts directory {directory} does not exist")
    prompts = [load_prompt_file(p) for p in sorted(directory.glob("*.json"))]
    if not prompts:
        raise ValueError(f"prompts directory {directory} holds no *.json prompt files")
    names = [p.name for p in prompts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"prompts directory {directory}: duplicate prompt names {dup}")
    if full:
        return prompts
    quick = [p for p in prompts if p.quick]
    if not quick:
        raise ValueError(f"prompts directory {directory}: no prompt marked \"quick\": true (use --full)")
    return quick
