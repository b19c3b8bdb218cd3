"""A cross-process lock beside a cache entry, so two processes never run NVRTC for the same kernel.

`fcntl.flock` on `<entry>.lock`: the kernel drops the lock when its holder exits, however it dies,
so a lock left by a dead process never blocks anyone. Waiting past the timeout is a one-line error.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from tlc.diagnostics import fail

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no cross-process lock, compiles may repeat
    fcntl = None  # type: ignore[assignment]

DEFAULT_TIMEOUT_S = 900.0  # a compile on a loaded 2-core machine can take minutes
_POLL_S = 0.05


def lock_timeout() -> float:
    """Seconds to wait for another process compiling the same kernel (`TLC_LOCK_TIMEOUT`, a finite
    number of seconds; anything else is refused in one line rather than read as the default)."""
    raw = os.environ.get("TLC_LOCK_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    from tlc.numbers import parse_float

    return parse_float(raw, "TLC_LOCK_TIMEOUT", minimum=0.0)


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return "another process"
    return f"process {pid}" if pid.isdigit() else "another process"


def _open_locked(path: Path, deadline: float, on_wait: Callable[[], None] | None) -> int:
    """An fd holding the flock on `path`, the file still linked there (a releaser may unlink it)."""
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise fail(f"timed out after {lock_timeout():.0f} s waiting for {_holder(path)} compiling "
                                   f"the same kernel (lock {path}); set TLC_LOCK_TIMEOUT to wait longer")
                    if not waited and on_wait is not None:
                        on_wait()
                    waited = True
                    time.sleep(_POLL_S)
            # The previous holder may have unlinked the file after we opened it: lock the live one.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: Path, timeout: float | None = None, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created 0600 if missing, its folder 0700; removed on release);
    `on_wait` runs once if another process holds it. A folder that refuses the lock file means no lock,
    not an error."""
    if fcntl is None:
        yield
        return
    deadline = time.monotonic() + (lock_timeout() if timeout is None else timeout)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = _open_locked(path, deadline, on_wait)
    except OSError:
        fd = None  # a read-only cache: compile without the lock, as the cache itself stores nothing
    if fd is None:
        yield
        return
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it: a waiter that opened it re-opens (samestat above)
        os.close(fd)
