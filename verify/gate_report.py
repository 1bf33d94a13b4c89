"""Verify reports: a JSON file (machine-readable, reproducible: no timestamps or timings), a Markdown
summary, and the console table. Pure formatting; the verdicts come from gate.compare."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .gate import Trace, Verdict


@dataclass
class PromptResult:
    name: str
    chat: bool
    prompt_ids: list[int]
    ours: Trace
    ref: Trace
    verdict: Verdict

    def to_dict(self, decode: Callable[[list[int]], str] | None = None) -> dict:
        def side(t: Trace) -> dict:
            d = {"tokens": t.tokens, "topk": [list(r) for r in t.topk], "stop": t.stop, "finite": t.finite}
            if decode is not None:
                d["text"] = decode(t.tokens)
            extra = {k: v for k, v in t.extra.items() if k != "text"}
            if extra:
                d["extra"] = extra
            return d

        return {"name": self.name, "chat": self.chat, "n_prompt_tokens": len(self.prompt_ids),
                "prompt_ids": self.prompt_ids, "verdict": self.verdict.to_dict(),
                "ours": side(self.ours), "reference": side(self.ref)}


@dataclass
class VerifyReport:
    model: str
    device: str
    n_tokens: int
    top_k: int
    full: bool
    results: list[PromptResult]
    settings: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.verdict.passed for r in self.results)

    def to_dict(self, decode=None) -> dict:
        return {"result": "PASS" if self.passed else "FAIL", "model": self.model, "device": self.device,
                "n_tokens": self.n_tokens, "top_k": self.top_k, "subset": "full" if self.full else "quick",
                "settings": self.settings,
                "n_passed": sum(r.verdict.passed for r in self.results), "n_prompts": len(self.results),
                "prompts": [r.to_dict(decode) for r in self.results]}


def _tok(decode, t: int | None) -> str:
    if t is None:
        return "-"
    if decode is None:
        return str(t)
    text = decode([t]).replace("\n", "\\n").replace("|", "\\|")
    if len(text) > 12:
        text = text[:11] + "…"
    return f"{t} {text!r}"


def _yn(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


HEADER = ("prompt", "chat", "steps", "diverge@", "ours / HF token", "ours∈HF", "HF∈ours", "verdict")


def rows(report: VerifyReport, decode=None) -> list[tuple[str, ...]]:
    out = []
    for r in report.results:
        v = r.verdict
        pair = "-" if v.divergence_step is None else f"{_tok(decode, v.ours_token)} / {_tok(decode, v.ref_token)}"
        out.append((r.name, "yes" if r.chat else "no", str(v.steps_compared),
                    "-" if v.divergence_step is None else str(v.divergence_step), pair,
                    _yn(v.ours_in_ref_topk), _yn(v.ref_in_ours_topk), "PASS" if v.passed else "FAIL"))
    return out


def console_table(report: VerifyReport, decode=None) -> str:
    header = HEADER[:5] + (f"ours∈HF top{report.top_k}", f"HF∈ours top{report.top_k}", "verdict")
    body = rows(report, decode)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(header), line(tuple("-" * w for w in widths))]
    out += [line(b) for b in body]
    return "\n".join(out)


def markdown(report: VerifyReport, decode=None) -> str:
    header = HEADER[:5] + (f"ours∈HF top{report.top_k}", f"HF∈ours top{report.top_k}", "verdict")
    lines = [f"# verify: {'PASS' if report.passed else 'FAIL'}", "",
             f"- model: `{report.model}`", f"- device: `{report.device}`",
             f"- subset: {'full' if report.full else 'quick'} ({len(report.results)} prompts), "
             f"{report.n_tokens} greedy tokens, top-{report.top_k} inclusion rule",
             f"- settings: {', '.join(f'{k}={v}' for k, v in report.settings.items()) or '-'}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report, decode)]
    lines.append("")
    for r in report.results:
        lines += [f"## {r.name}", "", f"- verdict: **{'PASS' if r.verdict.passed else 'FAIL'}** — {r.verdict.reason}"]
        if decode is not None:
            lines += [f"- ours: `{decode(r.ours.tokens)!r}`", f"- HF:   `{decode(r.ref.tokens)!r}`"]
        lines.append("")
    return "\n".join(lines)


def write(report: VerifyReport, report_dir: Path | str, decode=None) -> tuple[Path, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    js, md = report_dir / "report.json", report_dir / "report.md"
    js.write_text(json.dumps(report.to_dict(decode), indent=1) + "\n", encoding="utf-8")
    md.write_text(markdown(report, decode), encoding="utf-8")
    return js, md
