"""A loader factory for tests/test_ddp.py's timeout test, imported by torchrun ranks through the
launcher's ``learner`` task: rank 0 never returns."""
import time


def hang_on_rank0(dataset, epoch, rank, world_size):
    if rank == 0:
        time.sleep(600)
    return []
