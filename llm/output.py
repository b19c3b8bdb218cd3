"""Writing results: never clobber a file the user did not ask us to replace, never write outside the
chosen place, never write the API key."""
from __future__ import annotations

import os
from pathlib import Path

from tlc_llm.redact import leaks

MAX_NAME_BYTES = 255  # NAME_MAX on Linux and macOS


class OutputError(Exception):
    """An output cannot or may not be written; one-line message."""


class OutputExists(OutputError):
    """The output is already there and --force was not given."""


def plain_name_problem(name: str) -> str | None:
    """Why `name` is not a plain file name for the current directory (None if it is one).

    A replay takes its default output name from the transcript, which anyone may have edited:
    `../../x.tl` or `/home/u/.bashrc` would write outside the working directory."""
    if not name:
        return "it is empty"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "it contains control characters"
    if "/" in name or "\\" in name:
        return "it has directory parts"
    if name in (".", ".."):
        return "it names a directory"
    if len(name.encode("utf-8", errors="surrogatepass")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def ensure_writable(path: Path, force: bool) -> None:
    """Checked before any model call, so a run is never spent on a file we may not write."""
    if path.is_dir():
        raise OutputError(f"{path} is a directory; -o names the file to write")
    if (path.exists() or path.is_symlink()) and not force:
        raise OutputExists(f"{path} already exists; pass --force to overwrite it")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # the nearest folder that exists: the rest is created
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: {parent} is not writable")


def write_output(path: Path, data: str | bytes, force: bool, secret: str | None = None) -> None:
    """Exclusive create without --force (so a file that appeared meanwhile survives); atomic replace with it.

    The data is what was checked and built, so it is written as it is; if it holds the API key
    (an endpoint that echoes it into answers), nothing is written: redacting it would make the
    file differ from the program that was checked."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if leaks(raw.decode("utf-8", errors="replace"), secret):
        raise OutputError(f"not writing {path}: the model's answer contains the API key (the endpoint echoes "
                          "it back); the transcript has it redacted")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder {path.parent} for {path.name}: "
                          f"{exc.strerror or 'I/O error'}") from None
    try:
        if not force:
            with open(path, "xb") as handle:
                handle.write(raw)
            return
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_bytes(raw)
        os.replace(tmp, path)
    except FileExistsError:
        raise OutputExists(f"{path} already exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or 'I/O error'}") from None
