"""Jupyter kernels over Unix sockets: over TCP two kernels starting at once can take the same
port (2 of 313 starts failed on the 2-core machine, 0 of 312 over IPC). Without IPC (Windows, a
too-long temp path) they use TCP. For nbval: ``pytest -p course_utils.grading._nbval_kernels``."""
from __future__ import annotations

import os
import tempfile
import uuid

import zmq
from jupyter_client.manager import AsyncKernelManager, KernelManager
from traitlets import default

# A Unix socket's path must fit in sockaddr_un.sun_path: 108 bytes on Linux, 104 on macOS.
_MAX_SOCKET_PATH = 100


def _socket_prefix() -> str:
    """A fresh path prefix for one kernel's sockets (zmq appends '-<n>' to it)."""
    return os.path.join(tempfile.gettempdir(), f"jk-{uuid.uuid4().hex[:12]}")


def ipc_available() -> bool:
    """True when zmq here can use ``ipc://`` sockets and their paths fit in a socket name."""
    return (os.name == "posix" and bool(zmq.has("ipc")) and len(_socket_prefix()) + 8 <= _MAX_SOCKET_PATH)


def _ipc_subclass(base: type) -> type:
    class IpcKernelManager(base):  # type: ignore[misc, valid-type]
        """``base`` with its kernel's sockets on ``ipc://`` files under the temp directory."""

        @default("transport")
        def _default_transport(self) -> str:
            return "ipc"

        @default("ip")
        def _default_ip(self) -> str:
            # Not jupyter_client's default ('kernel-ipc' in the working directory, shared by every
            # kernel started there): a name of this kernel's own.
            return _socket_prefix()

    IpcKernelManager.__name__ = IpcKernelManager.__qualname__ = f"Ipc{base.__name__}"
    return IpcKernelManager


def kernel_manager_class(asynchronous: bool = True) -> type:
    """jupyter_client's (async) KernelManager, on IPC where :func:`ipc_available`."""
    base = AsyncKernelManager if asynchronous else KernelManager
    return _ipc_subclass(base) if ipc_available() else base
