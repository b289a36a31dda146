"""Stand-ins for Windows' and macOS' Python, on this Linux machine.

CI has no Windows or macOS machine, so the offload_core and nodes tests run a second and a
third time with this module installed before anything imports Ferry (tests/platform_site's
sitecustomize installs it in every Python started with FERRY_PLATFORM_STANDIN set, so child
processes get it too). What each stand-in takes away, as those platforms' CPython lacks it:

windows
  - ``os.preadv``, ``os.pread``, ``os.pwritev``, ``os.pwrite``, ``os.O_DIRECT``,
    ``os.posix_fadvise`` and the ``POSIX_FADV_*`` constants;
  - every ``mmap.MADV_*`` constant and ``mmap.mmap.madvise``;
  - the ``resource`` and ``fcntl`` modules, for Ferry's own code (torch on Linux imported them
    already, so the refusal is at Ferry's ``import`` statements);
  - ``/proc``, for Ferry's own code (psutil and torch keep their Linux readings, as on Windows
    they have their own);
  - Windows' file semantics for Ferry's own calls: a file open or mapped in this process
    cannot be deleted, renamed or replaced (``PermissionError``, as WinError 32), and a
    mapped file cannot be truncated, and a folder cannot be opened as a file. The tests' own fault injection (truncating or replacing
    a group file under a live offload) is let through: it stands for damage however it
    comes (a disk error, a crash between runs, a tool with delete access), which Ferry must
    survive on every platform; what Windows changes is what Ferry itself may do to a file it
    holds (repair, remove, cleanup), and that is what the stand-in refuses.
macos
  - ``os.O_DIRECT`` (macOS has F_NOCACHE instead), every ``mmap.MADV_*`` constant and
    ``mmap.mmap.madvise``, and ``/proc`` for Ferry's own code. macOS keeps ``os.preadv``,
    ``resource`` and ``fcntl``.

What a stand-in cannot show: real Win32 or Darwin I/O (its speed, FILE_FLAG_NO_BUFFERING's
alignment rules, F_NOCACHE), Windows' path forms on a real NTFS volume, WDDM's pinned-memory
limits, MPS. Those need the real OS.
"""

from __future__ import annotations

import builtins
import errno
import mmap
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Ferry's own code: the pack's product folders (tests and bench are instruments, not Ferry).
PACK_DIRS = tuple(
    str(REPO / d) + os.sep for d in ("offload_core", "nodes", "web", "webui", "scripts", "tools")
)
PLATFORMS = ("windows", "macos")

#: The real `open` and `os.listdir`, for the stand-in's own instruments (Ferry sees the stand-in).
_original: dict[str, Any] = {}


_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _from_ferry(depth: int = 2) -> bool:
    """Whether the code calling the patched function is Ferry's own: the first frame outside
    this file and the standard library (pathlib, shutil, io call os for their callers)."""
    frame = sys._getframe(depth)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(_STDLIB)
    ):
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and frame.f_code.co_filename.startswith(PACK_DIRS)


def _remove(module: Any, names: list[str]) -> None:
    for name in names:
        if hasattr(module, name):
            delattr(module, name)


class _MmapWithoutMadvise(mmap.mmap):
    """mmap.mmap without ``madvise`` (Windows' mmap has none; the C type's method cannot be
    deleted, so the stand-in's class answers AttributeError for it)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "madvise":
            raise AttributeError("'mmap.mmap' object has no attribute 'madvise'")
        return super().__getattribute__(name)


def _hide_proc() -> None:
    real_open, real_listdir = builtins.open, os.listdir

    def is_hidden(path: Any) -> bool:
        try:
            text = os.fsdecode(path) if not isinstance(path, int) else ""
        except TypeError:
            return False
        return text.startswith("/proc") and _from_ferry(3)

    def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
        if is_hidden(file):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(file))
        return real_open(file, *args, **kwargs)

    def listdir(path: Any = ".") -> Any:
        if is_hidden(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return real_listdir(path)

    builtins.open = open_
    import io

    io.open = open_  # pathlib reads through io.open
    os.listdir = listdir


def _refuse_ferry_imports(names: tuple[str, ...]) -> None:
    real_import = builtins.__import__

    def import_(name: str, globals: Any = None, *args: Any, **kwargs: Any) -> Any:
        ferry = globals is not None and str(globals.get("__file__") or "").startswith(PACK_DIRS)
        if ferry and name.split(".")[0] in names:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return real_import(name, globals, *args, **kwargs)

    builtins.__import__ = import_


def open_in_this_process(path: str) -> bool:
    """Whether ``path`` is open (a descriptor) or mapped in this process, read from /proc
    with the real calls (the stand-in's own instrument, not Ferry's)."""
    try:
        target = os.path.realpath(path)
    except OSError:
        return False
    fd_dir = "/proc/self/fd"
    for fd in _original.get("listdir", os.listdir)(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{fd}") == target:
                return True
        except OSError:
            continue
    return _mapped(target)


def _mapped(target: str) -> bool:
    """Whether the file at the real path ``target`` is mapped in this process."""
    with _original.get("open", builtins.open)("/proc/self/maps") as maps:
        return any(line.rstrip("\n").endswith(" " + target) for line in maps)


def _windows_file_semantics() -> None:
    real = {n: getattr(os, n) for n in ("unlink", "remove", "rename", "replace", "truncate")}

    def resolve(path: Any, dir_fd: int | None) -> str:
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):
            return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.abspath(path)

    def refuse(path: str) -> None:
        raise PermissionError(
            errno.EACCES,
            "[WinError 32] The process cannot access the file because it is being used by "
            "another process (Windows stand-in)",
            path,
        )

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        full = resolve(path, dir_fd)
        if _from_ferry() and open_in_this_process(full):
            refuse(full)
        real["unlink"](path, dir_fd=dir_fd)

    def rename_like(name: str) -> Any:
        def move(src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
            for p, fd in ((src, src_dir_fd), (dst, dst_dir_fd)):
                full = resolve(p, fd)
                if _from_ferry() and os.path.exists(full) and open_in_this_process(full):
                    refuse(full)
            real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

        return move

    def truncate(path: Any, length: int) -> None:
        if not isinstance(path, int) and _from_ferry():
            full = resolve(path, None)
            if _mapped(os.path.realpath(full)):
                raise PermissionError(
                    errno.EACCES,
                    "[WinError 1224] The requested operation cannot be performed on a file "
                    "with a user-mapped section open (Windows stand-in)",
                    full,
                )
        real["truncate"](path, length)

    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if _from_ferry() and not isinstance(path, int) and os.path.isdir(path):
            raise PermissionError(errno.EACCES, "Permission denied (Windows stand-in)", path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    os.open = open_
    os.unlink = unlink
    os.remove = unlink
    os.rename = rename_like("rename")
    os.replace = rename_like("replace")
    os.truncate = truncate


def install(platform: str) -> None:
    """Takes away what ``platform``'s CPython lacks; call before anything imports Ferry."""
    if platform not in PLATFORMS:
        raise ValueError(f"FERRY_PLATFORM_STANDIN={platform!r}: use one of {', '.join(PLATFORMS)}")
    _original["open"], _original["listdir"] = builtins.open, os.listdir
    madv = [n for n in dir(mmap) if n.startswith("MADV_")]
    _remove(mmap, madv)
    mmap.mmap = _MmapWithoutMadvise  # type: ignore[misc]
    _remove(os, ["O_DIRECT"])
    _hide_proc()
    if platform == "windows":
        fadv = [n for n in dir(os) if n.startswith("POSIX_FADV_")]
        _remove(os, ["preadv", "pread", "pwritev", "pwrite", "posix_fadvise", *fadv])
        _refuse_ferry_imports(("resource", "fcntl"))
        _windows_file_semantics()
    os.environ["FERRY_PLATFORM_STANDIN"] = platform
