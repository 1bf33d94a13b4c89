"""The CLI's argument types and the device-name check: each bad value is one line (`_Parser.error`) and exit code 2."""
from __future__ import annotations

import argparse
import sys

from .errors import UsageError

EXIT_BAD_INPUT = 2
DEVICES = ("auto", "npu", "emu", "emu-interp", "null")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


class OneLineParser(_Parser):
    """The CLI's argument parser for other command lines (python -m verify): a bad argument prints one line and
    exits with EXIT_BAD_INPUT."""


def _number(text: str, parse, ok, must: str):
    """`parse(text)` when it parses and `ok` holds, else one ArgumentTypeError line "must be <must>, got ..."."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {must}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v > 0, "a positive integer")


def non_negative_float(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < float("inf"), "a number >= 0")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "an integer >= 0 (0 = off)")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a number > 0")


def probability(text: str) -> float:
    return _number(text, float, lambda v: 0.0 < v <= 1.0, "in (0, 1]")


def port_number(text: str) -> int:
    return _number(text, int, lambda v: 0 <= v <= 65535, "a port number 0..65535 (0 = any free port)")


def seed_int(text: str) -> int:
    return _number(text, int, lambda v: 0 <= v < 2**64, "an integer in [0, 2**64)")


def bucket_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return values


def check_device(name: str | None) -> None:
    """--device, or $DEVICE when it is absent/auto, must name a device kind (checked before any work)."""
    import os

    shown = name if name not in (None, "", "auto") else os.environ.get("DEVICE") or "auto"
    if shown.lower() not in DEVICES:
        source = "--device" if name not in (None, "", "auto") else "DEVICE"
        raise UsageError(f"unknown device {shown!r} ({source}); expected one of {', '.join(DEVICES)}")
