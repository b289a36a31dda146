"""The CUDA backend's two contracts with PyTorch that CPU CI can hold (the GPU half,
tests/test_gpu.py, shows each one on a device):
- [Note: one family of events]: nothing in offload_core records or waits through a stream's
  ``record_event``/``wait_event`` (a ``torch.cuda.Event`` waited on by the generic compute
  stream is a silent no-op: the first H200 run gave wrong output that way);
- [Note: pinned memory is unregistered before it is unmapped]: every ``cudaHostRegister`` is
  undone with the same pointer, on release and when a buffer is dropped without one.
``torch.cuda.cudart()`` is replaced by a recorder (there is no CUDA runtime here); the memory,
the mappings and their lifetimes are real."""

from __future__ import annotations

import ast
import gc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import offload_core.disk.host_memory as host_memory
from offload_core.transfer.pinned import PinnedHost
from offload_core.transfer.streams import StreamBackend

ROOT = Path(__file__).resolve().parents[1] / "offload_core"
MiB = 1 << 20


def test_no_event_goes_through_a_streams_own_record_or_wait() -> None:
    calls = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("record_event", "wait_event")
            ):
                calls.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} .{node.func.attr}")
    assert calls == [], "use event.record(stream) / event.wait(stream) with a torch.Event"


class Cudart:
    """Records cudaHostRegister/Unregister as the runtime would see them: a range may be
    registered once, and unregistered only by the pointer it was registered with."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
        self.calls.append(("register", ptr))
        if any(p < ptr + nbytes and ptr < p + n for p, n in self.live.items()):
            return 712  # cudaErrorHostMemoryAlreadyRegistered
        self.live[ptr] = nbytes
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr))
        return 0 if self.live.pop(ptr, None) is not None else 713  # NotRegistered


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> Cudart:
    runtime = Cudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime)
    return runtime


@pytest.mark.parametrize("nbytes", [4096, 3 * MiB + 100, 24 * MiB])
@pytest.mark.parametrize("huge", [True, False])
def test_a_released_buffer_is_unregistered_by_its_own_pointer(
    cudart: Cudart, monkeypatch: pytest.MonkeyPatch, nbytes: int, huge: bool
) -> None:
    monkeypatch.setattr(host_memory, "huge_pages_advisable", lambda: huge)
    backend = StreamBackend(torch.device("cuda", 0))  # no CUDA call: the index is given
    buf = backend.empty_host(nbytes, pinned=True)
    assert buf.numel() == nbytes and buf.data_ptr() % 4096 == 0
    # is_pinned() (ComfyUI's guard before it registers a weight) asks about the storage's
    # first byte: it must be the registered one.
    assert buf.untyped_storage().data_ptr() == buf.data_ptr()
    buf.fill_(7)  # real memory, writable end to end
    assert cudart.live == {buf.data_ptr(): nbytes}
    backend.release_host(buf)
    backend.release_host(buf)  # a second release is nothing (no NotRegistered error)
    assert cudart.live == {} and cudart.calls == [
        ("register", buf.data_ptr()),
        ("unregister", buf.data_ptr()),
    ]


def test_a_dropped_buffer_is_unregistered_before_its_memory_goes(cudart: Cudart) -> None:
    host = PinnedHost()
    buf = host.buffer(8 * MiB)
    view = buf[4096:]  # a view keeps the mapping (and the registration) alive
    ptr = buf.data_ptr()
    del buf
    gc.collect()
    assert cudart.live == {ptr: 8 * MiB} and host.registered() == 1
    del view
    gc.collect()
    assert cudart.live == {} and host.registered() == 0
    again = host.buffer(8 * MiB)  # the same addresses may come back: registering succeeds
    assert cudart.live == {again.data_ptr(): 8 * MiB}
    host.release(again)


def test_a_failed_registration_says_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    refusing = SimpleNamespace(cudaHostRegister=lambda *a: 2, cudaHostUnregister=lambda p: 0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: refusing)
    with pytest.raises(RuntimeError, match="set tier to 'ram'"):
        PinnedHost().buffer(MiB)


def test_plain_host_memory_registers_nothing(cudart: Cudart) -> None:
    backend = StreamBackend(torch.device("cuda", 0))
    buf: Any = backend.empty_host(3 * MiB, pinned=False)
    backend.release_host(buf)
    assert cudart.calls == []
