"""pytest plugin (``-p course_utils.grading._nbval_kernels``): nbval starts its kernels over IPC
(:mod:`course_utils.grading.kernels` says why)."""
from __future__ import annotations

from .kernels import kernel_manager_class


def pytest_configure(config):  # noqa: D103 - pytest hook
    try:
        import nbval.kernel  # optional: a test dependency, absent in a learner's install
    except ImportError:  # pragma: no cover - nbval is a test dependency
        return
    # nbval.kernel.start_new_kernel looks KernelManager up in its module when it runs.
    nbval.kernel.KernelManager = kernel_manager_class(asynchronous=False)
