"""The cache directory on disk: inter-process locks (filelock), atomic file writes, the manifest and its
entries (an entry is reused only when its key matches and every recorded file is present with its recorded
sha256; a damaged entry means "rebuild")."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from filelock import FileLock

from ..devices.base import Artifact
from .keys import BUILD_FORMAT

MANIFEST = "manifest.json"


@contextlib.contextmanager
def flock(path: Path):
    """An exclusive inter-process lock on `path` (filelock; blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


def atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(cache_dir: Path) -> dict:
    """The manifest, or an empty one when missing, unreadable or of another BUILD_FORMAT."""
    try:
        data = json.loads((cache_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"build_format": BUILD_FORMAT, "targets": {}}
    if (not isinstance(data, dict) or data.get("build_format") != BUILD_FORMAT
            or not isinstance(data.get("targets"), dict)):
        return {"build_format": BUILD_FORMAT, "targets": {}}
    # Structurally damaged parts (hand edits, another tool) are dropped, which means "rebuild".
    data["targets"] = {t: {n: e for n, e in mods.items() if isinstance(n, str) and isinstance(e, dict)}
                       for t, mods in data["targets"].items() if isinstance(mods, dict)}
    return data


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_valid(cache_dir: Path, entry, key: str | None) -> bool:
    """The reuse test: same key (when given), every recorded file present with its recorded sha256."""
    cache_dir = Path(cache_dir)
    try:
        if not isinstance(entry.get("key"), str) or (key is not None and entry["key"] != key):
            return False
        if not isinstance(entry.get("kernel", "main"), str):
            return False
        root = cache_dir.resolve()
        base = (cache_dir / entry["dir"]).resolve()
        if root not in base.parents:      # an entry may only name files inside this cache
            return False
        files, sha = entry["files"], entry["sha256"]
        if not isinstance(files, dict) or not isinstance(sha, dict) or "mlir" not in files:
            return False
        for role, rel in files.items():
            p = (base / rel).resolve()
            if base not in p.parents or not p.is_file() or sha256_file(p) != sha[role]:
                return False
        return True
    except (KeyError, TypeError, AttributeError, ValueError, OSError):
        return False


def artifact_from_entry(cache_dir: Path, name: str, entry: dict) -> Artifact:
    base = cache_dir / entry["dir"]
    files = entry["files"]
    get = lambda role: (base / files[role]) if role in files else None  # noqa: E731
    return Artifact(name=name, mlir=base / files["mlir"], binary=get("binary"), insts=get("insts"),
                    xclbin=get("xclbin"), kernel=entry.get("kernel", "main"),
                    meta={"key": entry["key"], "times": entry.get("times", {}), "log": str(get("log") or "")})
