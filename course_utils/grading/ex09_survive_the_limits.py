"""Grader for exercise 09: ``fixed_loader(dataset)``'s loader run in real workers, every batch kept
(an evaluation loop), under a soft RLIMIT_NOFILE ``fd_spare`` above what is open (Linux); every
sample must arrive once, and workers x prefetch_factor x batch bytes fit ``shm_budget``."""
from __future__ import annotations

import os

import torch
import torch.multiprocessing as torch_mp
from torch.utils.data import DataLoader, Dataset

from course_utils.process_tree import stop_workers
from course_utils.start_methods import worker_timeout
from course_utils.tools.diagnose.health import tensors_in

from .checker import CheckResult, ExerciseFailed, call_answer, describe, grader, require_signature

LIMITS = "09.survive_the_limits"
N_SAMPLES, SIDE = 80, 32


class Detection(Dataset):
    """Image i filled with i, then its 1-3 boxes and labels: 3 tensors a sample."""

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple:
        return (torch.full((3, SIDE, SIDE), i, dtype=torch.uint8),
                {"boxes": torch.rand(1 + i % 3, 4), "labels": torch.full((1 + i % 3,), i)})


def _run(loader: DataLoader, fd_spare: int) -> tuple[list, bool]:
    """Every batch, kept; whether the descriptor limit applied (Linux: file_descriptor sharing)."""
    limited, it = "file_descriptor" in torch_mp.get_all_sharing_strategies(), iter(loader)
    if limited:     # after the workers started: only this process runs short, as in lesson 09
        import resource     # POSIX only: Windows has no resource module
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (min(len(os.listdir("/proc/self/fd")) + fd_spare, hard % 2**62), hard))
    try:
        return list(it), limited
    finally:
        if limited:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        stop_workers(it)


@grader(LIMITS)
def grade_limits(fixed_loader: object, *, fd_spare: int = 64,
                 shm_budget: int = 256 * 1024) -> CheckResult:
    """Grade ``fixed_loader(dataset) -> DataLoader`` against the descriptor and shm limits."""
    if not all(isinstance(x, int) and x > 0 for x in (fd_spare, shm_budget)):
        raise ValueError(f"check({LIMITS!r}): fd_spare={fd_spare!r} and shm_budget={shm_budget!r}"
                         f" must be positive whole numbers; leave them out for the exercise's.")
    expected = "fixed_loader(dataset) -> a torch.utils.data.DataLoader over dataset"
    require_signature(LIMITS, fixed_loader, "fixed_loader does not take 1 argument.", expected, 0)
    before = torch_mp.get_sharing_strategy()
    try:
        loader = call_answer(LIMITS, fixed_loader, Detection(), what="fixed_loader")
    finally:
        main_only = torch_mp.get_sharing_strategy() != before
        torch_mp.set_sharing_strategy(before)
    if not isinstance(loader, DataLoader) or loader.num_workers < 1:
        raise ExerciseFailed(LIMITS, "the answer does not give a loader with workers.",
                             expected=expected + ", num_workers >= 1", seen=describe(loader),
                             hint="return the DataLoader itself (do not iterate it); the limits "
                                  "are about what workers send the main process.")
    loader.timeout = loader.timeout or worker_timeout(30, loader.multiprocessing_context)
    try:
        batches, limited = _run(loader, fd_spare)
    except Exception as exc:        # the learner's loader can raise anything
        emfile = any(s in str(exc) for s in ("open files", "ancdata", "Errno 24"))
        raise ExerciseFailed(
            LIMITS, f"the loader failed: {str(exc).splitlines()[0][:200]}",
            expected=f"every batch kept with {fd_spare} spare descriptors",
            seen="file_system sharing set in this process only, the workers sharing by "
                 "descriptor" if main_only else type(exc).__name__,
            hint="run the loader yourself and read the traceback." if not emfile else
            "lesson 09, section 3 (Too many open files): " + (
                "the workers share the tensors, so they must set file_system themselves (a "
                "worker_init_fn)." if main_only else "each tensor kept holds a descriptor; "
                "collate into few tensors a batch, or share by file name in the workers.")) from exc
    firsts = [b[0] if isinstance(b, (list, tuple)) and b else b for b in batches]
    images = [torch.stack(list(x)) if isinstance(x, (list, tuple)) else x for x in firsts]
    if not all(isinstance(x, torch.Tensor) and x.shape[1:] == (3, SIDE, SIDE) for x in images):
        raise ExerciseFailed(LIMITS, "a batch does not start with its images.",
                             expected=f"(images, ...): images (B, 3, {SIDE}, {SIDE}) or B tensors",
                             seen=describe(firsts[0]), hint="keep the images first, the targets "
                                                            "after them.")
    ids = [i for x in images for i in x[:, 0, 0, 0].tolist()]
    if sorted(ids) != list(range(N_SAMPLES)):
        raise ExerciseFailed(LIMITS, "some samples never arrived, or came twice.",
                             expected=f"each of {N_SAMPLES} samples once", seen=f"{len(ids)} "
                             f"delivered, missing {sorted(set(range(N_SAMPLES)) - set(ids))[:10]}",
                             hint="keep every sample: no drop_last, no filtering in collate_fn.")
    batch_bytes = max(tensors_in(b)[1] for b in batches)
    in_flight = loader.num_workers * loader.prefetch_factor * batch_bytes
    if in_flight > shm_budget:
        raise ExerciseFailed(LIMITS, "the shared memory in flight exceeds the budget.",
                             expected=f"workers x prefetch_factor x batch <= {shm_budget:,} bytes",
                             seen=f"{loader.num_workers} x {loader.prefetch_factor} x "
                                  f"{batch_bytes:,} = {in_flight:,} bytes",
                             hint="lesson 09, section 1 (Shared memory in flight): fewer workers "
                                  "or a smaller prefetch_factor shrink it.")
    where = (f"with {fd_spare} spare descriptors" if limited else "(the descriptor limit needs "
             "Linux's file_descriptor sharing: not applied here)")
    return CheckResult(LIMITS, f"{N_SAMPLES} samples in {len(batches)} batches, all kept {where}; "
                       f"{in_flight:,} bytes in flight <= {shm_budget:,}.",
                       {"in_flight": in_flight, "batch_bytes": batch_bytes, "limited": limited})
