"""course_utils.grading.kernels: kernels over IPC sockets, so that concurrent starts cannot share a port."""
from __future__ import annotations

import glob
import os
import tempfile

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbformat.v4 import new_code_cell, new_notebook

from course_utils.grading import kernels

posix_only = pytest.mark.skipif(os.name != "posix", reason="zmq ipc:// needs Unix sockets")


@posix_only
def test_each_manager_gets_ipc_sockets_of_its_own():
    cls = kernels.kernel_manager_class()
    assert issubclass(cls, AsyncKernelManager) and cls is not AsyncKernelManager
    a, b = cls(kernel_name="python3"), cls(kernel_name="python3")
    assert a.transport == b.transport == "ipc"
    assert a.ip != b.ip  # jupyter_client's own default would be 'kernel-ipc' for both
    assert os.path.dirname(a.ip) == tempfile.gettempdir()
    assert issubclass(kernels.kernel_manager_class(asynchronous=False), KernelManager)


@posix_only
def test_a_notebook_runs_on_an_ipc_kernel_and_its_sockets_are_removed():
    from nbclient import NotebookClient
    nb = new_notebook(cells=[new_code_cell("print(6 * 7)")])
    seen = []
    client = NotebookClient(nb, kernel_name="python3", timeout=60,
                            kernel_manager_class=kernels.kernel_manager_class())
    client.on_notebook_start = lambda **_: seen.append(
        (client.km.transport, client.km.ip, glob.glob(client.km.ip + "-*")))
    client.execute()
    assert nb.cells[0].outputs[0]["text"].strip() == "42"
    transport, ip, sockets = seen[0]
    assert transport == "ipc" and len(sockets) == 5  # shell, iopub, stdin, control, heartbeat
    assert not glob.glob(ip + "-*")  # removed with the kernel


def test_falls_back_to_tcp_where_ipc_cannot_work(monkeypatch, tmp_path):
    long_dir = tmp_path / ("d" * 120)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(long_dir))
    assert not kernels.ipc_available()  # the socket's path would not fit in a socket name
    assert kernels.kernel_manager_class() is AsyncKernelManager
    assert kernels.kernel_manager_class(asynchronous=False) is KernelManager
    monkeypatch.undo()
    monkeypatch.setattr(kernels.os, "name", "nt")
    assert not kernels.ipc_available()


@posix_only
def test_the_nbval_plugin_gives_nbval_ipc_kernels(monkeypatch):
    import nbval.kernel
    from course_utils.grading import _nbval_kernels
    monkeypatch.setattr(nbval.kernel, "KernelManager", KernelManager)  # restored after the test
    _nbval_kernels.pytest_configure(config=None)
    assert nbval.kernel.KernelManager is not KernelManager
    km, kc = nbval.kernel.start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        assert km.transport == "ipc"
        reply = kc.execute_interactive("x = 1", timeout=30)
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert not glob.glob(km.ip + "-*")  # the socket files went with the kernel
