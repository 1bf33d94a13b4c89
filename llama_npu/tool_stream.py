"""The model's reply text, as it streams, split into content and OpenAI tool-call deltas (tool_calls.py's
syntaxes): plain text goes out as content (text that could open a call is held back until the next delta
decides); a call goes out as its id and name, then its arguments in fragments.

`incremental` (the reply is grammar-constrained, so the arguments are valid JSON by construction): argument
fragments are sent as they are generated. Otherwise (tool_choice "auto": the model writes freely) a call is
held back until it is complete and parses, and sent whole; one that does not parse, or names an unknown
tool, is sent as content. Either way the concatenated `arguments` of a call is a JSON string that parses.
"""
from __future__ import annotations

import json
import re

from .tool_calls import ToolSyntax, new_call_id

HEAD_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class _ArgsScanner:
    """Finds where one JSON value ends in text that arrives in pieces (strings and escapes respected)."""

    def __init__(self):
        self.depth, self.in_str, self.esc, self.started, self.done = 0, False, False, False, False

    def feed(self, text: str) -> int:
        """Consume `text`; returns how many characters belong to the value (all of them until it ends)."""
        for i, ch in enumerate(text):
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif ch == "\\":
                    self.esc = True
                elif ch == '"':
                    self.in_str = False
            elif ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
            if not self.started and not ch.isspace():
                self.started = True
            if self.started and self.depth == 0 and not self.in_str:
                self.done = True
                return i + 1
        return len(text)


class ToolCallStream:
    def __init__(self, syntax: ToolSyntax, names: list[str], incremental: bool):
        self.syntax, self.names, self.incremental = syntax, set(names), incremental
        self.state = "text" if syntax.start else "start"
        self.buf = ""          # text not yet decided
        self.calls: list[dict] = []   # {"id", "name", "arguments"} so far
        self._scan: _ArgsScanner | None = None

    # Events: ("content", text) | ("call", index, id, name) | ("args", index, fragment)
    def push(self, delta: str) -> list[tuple]:
        self.buf += delta
        events: list[tuple] = []
        while True:
            before = (self.state, len(self.buf))
            getattr(self, "_" + self.state)(events, final=False)
            if (self.state, len(self.buf)) == before:
                return events

    def finish(self) -> list[tuple]:
        """The end of the reply: what was held back is decided."""
        events: list[tuple] = []
        for _ in range(4):
            getattr(self, "_" + self.state)(events, final=True)
        if self.buf and self.state != "after":
            events.append(("content", self.buf))
        self.buf = ""
        return events

    # ------------------------------------------------------------------------------------ states
    def _start(self, events, final) -> None:  # bare-JSON syntax: the reply is a call if it starts with "{"
        s = self.buf.lstrip()
        if s:
            self.state = "call" if s.startswith("{") else "plain"
        elif final:
            self.state = "plain"

    def _plain(self, events, final) -> None:
        if self.buf:
            events.append(("content", self.buf))
            self.buf = ""

    def _text(self, events, final) -> None:
        start = self.syntax.start.strip()
        i = self.buf.find(start)
        if i >= 0:
            if self.buf[:i].strip():
                events.append(("content", self.buf[:i].rstrip()))
            self.buf = self.buf[i + len(start):]
            self.state = "call"
            return
        keep = 0 if final else _held_prefix(self.buf, start)
        if not final:  # trailing whitespace waits too: before a call it is dropped
            keep = len(self.buf) - len(self.buf[: len(self.buf) - keep].rstrip())
        out = self.buf[: len(self.buf) - keep]
        if out and (out.strip() or not self.calls):
            events.append(("content", out))
        self.buf = self.buf[len(self.buf) - keep:]

    def _call(self, events, final) -> None:
        end = self.syntax.end.strip()
        if self.incremental:
            m = HEAD_RE.match(self.buf)
            if m:
                self._open(events, json.loads(f'"{m.group(1)}"'))
                self.buf = self.buf[m.end():]
                self.state, self._scan = "args", _ArgsScanner()
                return
        j = self.buf.find(end) if end else -1
        if j >= 0 or final:
            body = self.buf[:j] if j >= 0 else self.buf
            self.buf = self.buf[j + len(end):] if j >= 0 else ""
            self._whole(events, body)
            self.state = "text" if self.syntax.start else "after"

    def _args(self, events, final) -> None:
        if not self._scan.started:
            self.buf = self.buf.lstrip()
        n = self._scan.feed(self.buf)
        if n:
            events.append(("args", len(self.calls) - 1, self.buf[:n]))
            self.calls[-1]["arguments"] += self.buf[:n]
            self.buf = self.buf[n:]
        if self._scan.done:
            self.state = "close"

    def _close(self, events, final) -> None:  # after the arguments: the rest of the call, up to its end
        end = self.syntax.end.strip()
        j = self.buf.find(end) if end else -1
        if j >= 0:
            self.buf = self.buf[j + len(end):]
            self.state = "text"
        elif not end or final:
            self.buf, self.state = "", "after" if not end else "text"

    def _after(self, events, final) -> None:  # a bare-JSON call is the whole reply: the rest is dropped
        self.buf = ""

    # ------------------------------------------------------------------------------------ helpers
    def _open(self, events, name: str) -> None:
        cid = new_call_id()
        self.calls.append({"id": cid, "name": name, "arguments": ""})
        events.append(("call", len(self.calls) - 1, cid, name))

    def _whole(self, events, body: str) -> None:
        try:
            obj = json.loads(body)
            args = obj.get(self.syntax.args_key, obj.get("arguments", obj.get("parameters", {})))
            ok = isinstance(obj, dict) and obj.get("name") in self.names and isinstance(args, dict)
        except (json.JSONDecodeError, AttributeError):
            ok = False
        if not ok:
            events.append(("content", self.syntax.start.strip() + body + self.syntax.end.strip()))
            return
        self._open(events, obj["name"])
        text = json.dumps(args, ensure_ascii=False)
        self.calls[-1]["arguments"] = text
        events.append(("args", len(self.calls) - 1, text))
