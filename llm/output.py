"""Writing results: never clobber a file the user did not ask us to replace."""
from __future__ import annotations

import os
from pathlib import Path


class OutputExists(Exception):
    """The output is already there and --force was not given."""


def ensure_writable(path: Path, force: bool) -> None:
    """Checked before any model call, so a run is never spent on a file we may not write."""
    if path.exists() and not force:
        raise OutputExists(f"{path} already exists; pass --force to overwrite it")
    if path.exists() and path.is_dir():
        raise OutputExists(f"{path} is a directory")


def write_output(path: Path, data: str | bytes, force: bool) -> None:
    """Exclusive create without --force (so a file that appeared meanwhile survives); atomic replace with it."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if not force:
        try:
            with open(path, "xb") as handle:
                handle.write(raw)
        except FileExistsError:
            raise OutputExists(f"{path} already exists; pass --force to overwrite it") from None
        return
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(raw)
    os.replace(tmp, path)
