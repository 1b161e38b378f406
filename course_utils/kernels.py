"""Start Jupyter kernels over Unix sockets, so that kernels starting at the same time cannot
take each other's ports.

jupyter_client gives a kernel five TCP ports by binding port 0, reading the number and closing
the socket; the kernel binds them a moment later. When several kernels start at once (pytest-xdist
running notebooks next to tests that grade or time notebooks), two can pick the same port: one
dies with ``Address already in use`` ("Kernel died before replying to kernel_info"), or a client
talks to another kernel's socket (``Invalid Signature`` in the kernel's log). Measured on the
2-core development machine: 4 processes starting and stopping kernels for 120 s, 2 of 313 starts
failed over TCP and 0 of 312 over IPC.

Over IPC (zmq's ``ipc://`` transport, a Unix domain socket) each kernel's sockets are files named
after a fresh random name, so there is nothing to race for. Where IPC is not available (Windows
builds of zmq, or a temporary directory whose path is too long for a socket name) the kernels use
TCP as usual.

    from nbclient import NotebookClient
    NotebookClient(nb, kernel_manager_class=kernel_manager_class())

For nbval, ``pytest -p course_utils._nbval_kernels`` makes its kernels do the same.
Nothing happens on import.
"""
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
    if os.name != "posix":
        return False
    return bool(zmq.has("ipc")) and len(_socket_prefix()) + 8 <= _MAX_SOCKET_PATH


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
    """The kernel manager class to start kernels with: jupyter_client's ``AsyncKernelManager``
    (``asynchronous=True``, what nbclient uses) or ``KernelManager`` (what nbval uses), on IPC
    where :func:`ipc_available`, else the class itself (TCP)."""
    base = AsyncKernelManager if asynchronous else KernelManager
    return _ipc_subclass(base) if ipc_available() else base
