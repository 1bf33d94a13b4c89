"""docs/troubleshooting.md quotes the code's own messages: every backtick-quoted piece of a symptom column
(split at `...`, the parts that vary) occurs verbatim in the source; shell commands and other programs'
messages (XRT's) are not ours."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_OURS = ("make ", "xrt-smi", "pip", "pyxrt", "/dev/", "llama-npu run --raw", "bo allocation failed")


def _sources() -> str:
    return "\n".join(p.read_text() for d in ("llama_npu", "kernel_builder", "verify", "benchmarks")
                     for p in sorted((ROOT / d).rglob("*.py")))


def _symptom_quotes(md: str) -> list[str]:
    out = []
    for line in md.splitlines():
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| symptom"):
            continue
        symptom = re.split(r"(?<!\\)\|", line)[1]
        out += [q for q in re.findall(r"`([^`]+)`", symptom) if not q.startswith(NOT_OURS)]
    return out


def test_every_quoted_message_is_in_the_code():
    src = _sources()
    quotes = _symptom_quotes((ROOT / "docs" / "troubleshooting.md").read_text())
    assert len(quotes) >= 15, quotes
    missing = []
    for q in quotes:
        for part in q.split("..."):
            part = part.strip(" ;:,")
            if len(part) >= 6 and part not in src:
                missing.append((q, part))
    assert not missing, "docs/troubleshooting.md quotes text the code does not print:\n" + \
        "\n".join(f"  {part!r}  (in `{q}`)" for q, part in missing)


def test_the_check_catches_a_stale_message():
    src = _sources()
    assert "unsupported model: " + "GPT2" not in src   # the old row's text: the check would have failed on it
