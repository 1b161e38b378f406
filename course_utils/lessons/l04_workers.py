"""Lesson 04's harness for what happens in DataLoader workers: the price of ``pin_memory=True``
(:func:`pin_memory_cost`) and CUDA in a forked worker (:func:`cuda_in_forked_worker`, run in a
fresh subprocess with a timeout). Nothing happens at import time.
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from ..bench import measure_loader
from ..checks import check_int
from ..config import pick
from ..data import ArrayDataset
from ..device import move_to_device, resolve_device, synchronize
from ..machine import usable_cpus
from ..measurement import Measurement, _fmt_time
from .l04_copies import _median, time_op

__all__ = [
    "PinCost",
    "pin_memory_cost",
    "CudaTouchingDataset",
    "HostTensorDataset",
    "torch_fork_error_message",
    "ForkedCudaDemo",
    "cuda_in_forked_worker",
]


# --------------------------------------------------------------------------------------
# moving batches
# --------------------------------------------------------------------------------------

class _CopyingLoader:
    """Iterates ``loader`` and moves each batch to ``device``, synchronised, so that a loader
    timing includes the copy. Forwards the DataLoader settings measure_loader reports."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device
        for name in ("num_workers", "batch_size", "pin_memory", "persistent_workers",
                     "prefetch_factor", "multiprocessing_context"):
            if hasattr(loader, name):
                setattr(self, name, getattr(loader, name))

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            moved = move_to_device(batch, self.device, non_blocking=True)
            synchronize(self.device)
            yield moved


# --------------------------------------------------------------------------------------
# pin_memory=True in a DataLoader
# --------------------------------------------------------------------------------------

@dataclass
class PinCost:
    """pin_memory=False vs True in a DataLoader, each batch copied to the device.

    ``measurements``: :meth:`course_utils.measurement.Measurement.to_dict` of each loader (samples/s
    including the synchronised copy; CPU-s/sample of the whole process tree, pin thread
    included). ``memcpy_s_per_batch``: a host memcpy of one batch's bytes — the least that
    pinning a batch costs the pin thread (it copies the batch into page-locked memory).
    ``meaningful`` is False without CUDA: then pin_memory=True does nothing.
    """

    device: str
    meaningful: bool
    batch_size: int
    batch_bytes: int
    num_workers: int
    measurements: list[dict]
    memcpy_s_per_batch: float
    note: str = ""

    def measurement(self, pin_memory: bool) -> Any:
        for m in self.measurements:
            if m.get("settings", {}).get("pin_memory") == pin_memory:
                return Measurement.from_dict(m)
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"pin_memory in a DataLoader ({self.num_workers} workers, batches of "
                 f"{self.batch_size} = {self.batch_bytes / 1e6:.1f} MB), copied to {self.device}"]
        for pin in (False, True):
            m = self.measurement(pin)
            if m is not None:
                cpu = m.cpu_s_per_sample
                lines.append(f"  pin_memory={str(pin):<5} {m.samples_per_s:10,.0f} samples/s   "
                             f"{'n/a' if cpu is None else f'{cpu * 1e3:.3f} ms'} CPU per sample")
        lines.append(f"  a host memcpy of one batch (the least pinning it costs): "
                     f"{_fmt_time(self.memcpy_s_per_batch)}")
        if self.note:
            lines.append("  " + self.note)
        return "\n".join(lines)


def pin_memory_cost(dataset: Dataset | None = None, *, batch_size: int | None = None,
                    num_workers: int | None = None, batches: int | None = None,
                    repeats: int | None = None, device: Any = None,
                    progress: bool = True) -> PinCost:
    """What ``pin_memory=True`` costs and buys in a DataLoader.

    The dataset defaults to an in-memory :class:`course_utils.data.ArrayDataset` of uint8
    3x224x224 images (little work per sample, so the pin thread's cost is visible). Each loader
    is timed with :func:`course_utils.bench.measure_loader` while every batch is copied to the
    device and synchronised (pinned batches with ``non_blocking=True``). On CUDA both
    ``pin_memory=False`` and ``True`` are measured; elsewhere only ``False`` (PyTorch skips
    pinning without an accelerator), and the result says it is not meaningful here.
    """

    dev = resolve_device(device)
    batch_size = pick(full=128, quick=32) if batch_size is None else batch_size
    check_int("batch_size", batch_size, 1)
    num_workers = min(4, usable_cpus()) if num_workers is None else num_workers
    check_int("num_workers", num_workers, 0)
    batches = pick(full=40, quick=6) if batches is None else batches
    check_int("batches", batches, 1)
    repeats = pick(full=3, quick=2) if repeats is None else repeats
    check_int("repeats", repeats, 1)
    warmup = max(2, num_workers)
    if dataset is None:
        dataset = ArrayDataset(n=batch_size * (batches + warmup + 1), shape=(3, 224, 224))
    if len(dataset) < batch_size * (batches + warmup):
        raise ValueError(f"dataset has {len(dataset)} samples, fewer than batch_size={batch_size} x "
                         f"(batches={batches} + {warmup} warm-up): pass fewer batches or a bigger dataset.")
    sample, _ = dataset[0]
    batch_bytes = int(sample.numel() * sample.element_size()) * batch_size
    buf_src = torch.empty(batch_bytes, dtype=torch.uint8).fill_(1)
    buf_dst = torch.empty(batch_bytes, dtype=torch.uint8)
    memcpy = _median(time_op(lambda: buf_dst.copy_(buf_src), device="cpu",
                             repeats=pick(full=9, quick=5), warmup=1))
    del buf_src, buf_dst
    meaningful = dev.type == "cuda"
    pins = (False, True) if meaningful else (False,)
    results = []
    for pin in pins:
        kwargs: dict = dict(batch_size=batch_size, num_workers=num_workers, pin_memory=pin,
                            shuffle=False)
        if num_workers:
            kwargs.update(timeout=120, persistent_workers=False)
        loader = DataLoader(dataset, **kwargs)
        m = measure_loader(_CopyingLoader(loader, dev), batches=batches, warmup_batches=warmup,
                           repeats=repeats, label=f"pin_memory={pin}",
                           settings={"pin_memory": pin, "device": str(dev)}, progress=progress)
        results.append(m.to_dict())
        del loader
    if meaningful:
        note = ("pin_memory=True: a thread in the main process copies every batch into page-locked "
                "memory (CPU time, counted in CPU per sample); the copy to the GPU then runs by DMA "
                "and can be non_blocking.")
    else:
        note = (f"Not meaningful on {dev.type}: without CUDA, pin_memory=True does nothing "
                f"(PyTorch warns and skips it), so only pin_memory=False was measured. Pinning a "
                f"batch is at least a copy of its bytes: the memcpy above is that lower bound on "
                f"this CPU.")
    return PinCost(device=str(dev), meaningful=meaningful, batch_size=batch_size,
                   batch_bytes=batch_bytes, num_workers=num_workers, measurements=results,
                   memcpy_s_per_batch=memcpy, note=note)


# --------------------------------------------------------------------------------------
# CUDA in a forked worker
# --------------------------------------------------------------------------------------

class CudaTouchingDataset(Dataset):
    """The mistake: ``__getitem__`` moves each sample to CUDA inside the worker."""

    def __init__(self, n: int = 8) -> None:
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = torch.full((3, 8, 8), i % 256, dtype=torch.uint8)
        return x.to("cuda"), i


class HostTensorDataset(Dataset):
    """The right pattern: workers return CPU (uint8) tensors; the main process moves batches."""

    def __init__(self, n: int = 8) -> None:
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 8, 8), i % 256, dtype=torch.uint8), i


def torch_fork_error_message() -> str | None:
    """The 'forked subprocess' error message as written in the installed torch's source.

    Read from ``torch.cuda._lazy_init`` with :mod:`inspect` (None if this torch's source is
    not available or is written differently). This is *quoted from the source*, not produced
    by running anything.
    """
    try:
        source = inspect.getsource(torch.cuda._lazy_init)
    except (OSError, TypeError, AttributeError):
        return None
    match = re.search(r"_is_in_bad_fork\(\)\s*:\s*raise\s+RuntimeError\(\s*((?:(?:\"[^\"]*\"|'[^']*')\s*)+)\)",
                      source)
    if not match:
        return None
    try:
        return str(ast.literal_eval("(" + match.group(1) + ")"))
    except (ValueError, SyntaxError):
        return None


_FORK_SCRIPT = r'''
import json, os, sys, threading, time, traceback, warnings
out = {"fork": hasattr(os, "fork")}
import torch
from torch.utils.data import DataLoader
from course_utils.lessons.l04_workers import CudaTouchingDataset, HostTensorDataset
out["cuda_build"] = torch.version.cuda
cuda = torch.cuda.is_available()           # a CUDA build initialises the driver here, GPU or not
out["cuda"] = cuda
if cuda:
    torch.zeros(1, device="cuda")          # the training script uses CUDA first, as usual
out["parent_used_cuda"] = cuda
if out["fork"]:
    try:
        loader = DataLoader(CudaTouchingDataset(4), batch_size=2, num_workers=1,
                            multiprocessing_context="fork", timeout=30)
        next(iter(loader))
        out["wrong_error"] = None
    except Exception as exc:
        out["wrong_error"] = type(exc).__name__ + ": " + str(exc)
    try:
        loader = DataLoader(HostTensorDataset(8), batch_size=4, num_workers=2,
                            multiprocessing_context="fork", pin_memory=cuda, timeout=30)
        device = "cuda" if cuda else "cpu"
        seen = []
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            seen += y.tolist()
        out["right_ok"] = seen == list(range(8))
        out["right_text"] = ("2 forked workers returned CPU uint8 tensors; the main process moved "
                             "8 samples to " + device + " in order")
    except Exception as exc:
        out["right_ok"] = False
        out["right_text"] = type(exc).__name__ + ": " + str(exc)
    # the mechanism, with no GPU needed: a lock held by a thread at fork time
    lock = threading.Lock()
    started = threading.Event()
    def holder():
        with lock:
            started.set()
            time.sleep(1.5)
    t = threading.Thread(target=holder, daemon=True)
    t.start()
    started.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pid = os.fork()
    if pid == 0:
        ok = lock.acquire(timeout=0.5)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
    out["lock_held_in_child"] = code == 3
    out["fork_warning"] = str(caught[0].message) if caught else None
    t.join()
print("@@RESULT@@" + json.dumps(out))
'''


@dataclass
class ForkedCudaDemo:
    """What happens when a forked DataLoader worker touches CUDA, run in a subprocess.

    ``worker_error``: the last line of the error the forked worker raised on THIS machine
    (exact text); on a CUDA machine it is torch's "Cannot re-initialize CUDA in forked
    subprocess" error, elsewhere whatever touching CUDA says here (e.g. "Torch not compiled
    with CUDA enabled"). ``torch_message``: the CUDA error as written in the installed torch's
    source (quoted, not produced). ``lock_held_in_child``: the mechanism reproduced without a
    GPU — a lock held by a parent thread at fork time stays held in the child, where no thread
    will ever release it.
    """

    cuda_available: bool
    fork_available: bool
    parent_used_cuda: bool
    worker_error: str | None
    worker_error_full: str | None
    torch_message: str | None
    torch_message_source: str
    right_pattern_ok: bool
    right_pattern_text: str
    lock_held_in_child: bool | None
    fork_warning: str | None
    timed_out: bool = False
    stderr_tail: str = ""
    cuda_build: str | None = None

    @property
    def reproduced_cuda_error(self) -> bool:
        """True when this run produced torch's forked-CUDA error for real."""
        return bool(self.worker_error and "Cannot re-initialize CUDA in forked subprocess"
                    in self.worker_error)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["reproduced_cuda_error"] = self.reproduced_cuda_error
        return out

    def __str__(self) -> str:
        lines = []
        if self.timed_out:
            return ("The forked-worker demo did not finish within its timeout and was stopped "
                    f"(nothing hangs): {self.stderr_tail}")
        if not self.fork_available:
            return ("This platform has no fork (e.g. Windows): DataLoader workers are spawned, "
                    "each imports torch afresh and may initialise CUDA itself, so the forked-CUDA "
                    "error cannot happen here.")
        if self.reproduced_cuda_error and self.parent_used_cuda:
            lines.append("Measured here (CUDA): the parent used CUDA, then a forked DataLoader "
                         "worker touched CUDA and raised:")
            lines.append(f"    {self.worker_error}")
        elif self.reproduced_cuda_error:
            lines.append(f"Measured here: the parent never used CUDA (this machine has no usable "
                         f"GPU); it only called torch.cuda.is_available(). With this CUDA "
                         f"{self.cuda_build} build of torch that call already initialises the CUDA "
                         f"driver, so a forked DataLoader worker that touched CUDA raised:")
            lines.append(f"    {self.worker_error}")
            lines.append("So with the default (CUDA) torch on Linux, even a GPU-less laptop hits "
                         "this error: keep CUDA out of forked workers everywhere.")
        else:
            what = ("This torch is a CPU-only build" if not self.cuda_build else
                    "This run did not produce torch's forked-CUDA error")
            lines.append(f"{what}, so the forked worker could not fail the way it does on a GPU "
                         "machine. What a forked worker that touches CUDA raised here (real, "
                         "from this run):")
            lines.append(f"    {self.worker_error}")
            if self.torch_message:
                lines.append(f"On a CUDA machine, the worker raises this instead — QUOTED FROM "
                             f"{self.torch_message_source}, not produced here:")
                lines.append(f"    RuntimeError: {self.torch_message}")
        if self.lock_held_in_child is not None:
            lines.append("The mechanism, reproduced here without a GPU: a thread held a lock when "
                         "the process forked; in the child the lock was "
                         + ("still held, with no thread left to release it (acquire(timeout=0.5) "
                            "failed: without the timeout the child would wait forever)."
                            if self.lock_held_in_child else "free (this run did not show it)."))
            if self.fork_warning:
                lines.append(f"    Python itself warned at fork: {self.fork_warning}")
            lines.append("A CUDA context is driver state with threads, locks and device handles "
                         "like that lock; a forked copy of it is unusable, so torch refuses "
                         "(it marks the child 'in bad fork') instead of hanging.")
        lines.append(f"The right pattern: {self.right_pattern_text} "
                     f"({'worked' if self.right_pattern_ok else 'FAILED'}). Workers return CPU "
                     f"tensors; pin_memory=True; the main process copies with "
                     f".to(device, non_blocking=True) (or a DevicePrefetcher). Only if workers "
                     f"must run CUDA code: multiprocessing_context='spawn' (each worker then "
                     f"starts its own CUDA context: slow start-up, memory per worker).")
        return "\n".join(lines)


def cuda_in_forked_worker(timeout_s: float = 60.0) -> ForkedCudaDemo:
    """Run the forked-worker CUDA demo in a fresh Python subprocess (killed after ``timeout_s``).

    In the subprocess: the parent uses CUDA when it can, then a DataLoader with one *forked*
    worker runs :class:`CudaTouchingDataset` (which calls ``.to('cuda')`` in the worker), and
    the exact error is captured; then the right pattern (:class:`HostTensorDataset`, CPU
    tensors from workers, copy in the main process) runs; then the lock-across-fork mechanism.
    A subprocess keeps this process's CUDA state and workers untouched.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    source = f"torch/cuda/__init__.py, _lazy_init (torch {torch.__version__})"
    message = torch_fork_error_message()
    try:
        proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True,
                              text=True, timeout=timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return ForkedCudaDemo(False, hasattr(os, "fork"), False, None, None, message, source,
                              False, "not run (timeout)", None, None, timed_out=True,
                              stderr_tail=f"timed out after {timeout_s:g} s. {tail}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("@@RESULT@@")]
    if not lines:
        raise RuntimeError(f"the forked-worker demo subprocess failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}")
    out = json.loads(lines[-1][len("@@RESULT@@"):])
    full = out.get("wrong_error")
    last = None
    if full:
        text_lines = [l.strip() for l in full.strip().splitlines() if l.strip()]
        last = text_lines[-1] if text_lines else full
    return ForkedCudaDemo(
        cuda_available=bool(out.get("cuda")), fork_available=bool(out.get("fork")),
        parent_used_cuda=bool(out.get("parent_used_cuda")), worker_error=last,
        worker_error_full=full, torch_message=message, torch_message_source=source,
        right_pattern_ok=bool(out.get("right_ok")),
        right_pattern_text=str(out.get("right_text", "not run (no fork on this platform)")),
        lock_held_in_child=out.get("lock_held_in_child"), fork_warning=out.get("fork_warning"),
        stderr_tail=proc.stderr[-500:] if proc.returncode else "", cuda_build=out.get("cuda_build"))
