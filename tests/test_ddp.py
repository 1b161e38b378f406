"""The torchrun launcher (course_utils.tools.ddp): its argument checks, and real launches: the
sampler under every worker start method, the bench task through the engine's window, a rank that
crashes, and a rank that never finishes (the timeout; its loader is tests/_ddp_tasks.py)."""
from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from course_utils.lessons.l07_scaling_out import sharding_report
from course_utils.timing import MIN_TIMED_BATCHES
from course_utils.tools.ddp import rank as rank_program
from course_utils.tools.ddp.launch import DistributedError, launch, pick_backend

pytestmark = pytest.mark.timeout(240)


# ---- launch: arguments (no processes) ----------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    ({"task": "train"}, ValueError, "task='train'"),
    ({"task": "sampler", "nproc": 0}, ValueError, "nproc"),
    ({"task": "sampler", "timeout_s": 0}, ValueError, "timeout_s"),
    ({"task": "sampler", "backend": "mpi"}, ValueError, "backend='mpi'"),
    ({"task": "sampler", "config": {"x": object()}}, TypeError, "JSON"),
    ({"task": "sampler", "config": [1]}, TypeError, "config must be a dict"),
])
def test_launch_bad_arguments_are_named(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        launch(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 2,
                    reason="this machine can run nccl")
def test_nccl_without_gpus_is_refused_and_gloo_is_picked():
    assert pick_backend(2) == "gloo"
    with pytest.raises(ValueError, match="nccl"):
        launch("sampler", backend="nccl")


@pytest.mark.parametrize("backend, local_rank, device", [
    ("nccl", 1, torch.device("cuda", 1)),      # nccl reduces CUDA tensors only: the rank's GPU
    ("gloo", 1, torch.device("cpu")),           # gloo: CPU, whatever the local rank
])
def test_the_sampler_reduces_on_the_backends_device(monkeypatch, backend, local_rank, device):
    """The all-reduce tensor is made on the device the backend needs (here with the collective
    patched out, and the tensor made on the CPU whatever device was asked for)."""
    asked, made = [], torch.tensor

    def tensor(data, *args, device=None, **kwargs):
        if device is not None:
            asked.append(torch.device(device))
        return made(data, *args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    monkeypatch.setattr(rank_program.dist, "all_reduce", lambda t: t.mul_(3))   # as if 3 ranks
    out = rank_program._sampler({"n": 7, "variants": [{"name": "a", "epochs": [0]}]}, 0, 2,
                                local_rank, backend)
    assert asked == [device] and out["drawn"] == 4 and out["all_reduce_total"] == 12


# ---- launch: real ranks -------------------------------------------------------------------------

def test_ranks_shard_with_workers_under_every_start_method():
    methods = multiprocessing.get_all_start_methods()
    variants = [{"name": "main", "epochs": [0, 1], "batch_size": 3}]
    variants += [{"name": m, "epochs": [1], "num_workers": 1, "start_method": m} for m in methods]
    run = launch("sampler", {"n": 11, "variants": variants}, nproc=2, timeout_s=200)
    assert len(run.ranks) == 2 and run.backend == "gloo" and "2 rank(s)" in str(run)

    def report(variant):
        return sharding_report([{"rank": r["rank"], "epochs": r["variants"][variant]}
                                for r in run.ranks], 11)

    main = report("main")
    assert all("plus 1 repeated as padding" in e.verdict() for e in main.epochs)
    assert main.order_changes_every_epoch
    for m in methods:  # workers give the same indices as the main process, whatever the method
        assert report(m).epochs[0].per_rank == main.epochs[1].per_rank, m
    # torchrun sets OMP_NUM_THREADS=1 for each rank when --nproc-per-node > 1 and it is unset
    for r in run.ranks:
        if "OMP_NUM_THREADS" not in os.environ:
            assert r["omp_num_threads_env"] == "1" and r["pools_at_start"]["torch_intra"] == 1
        assert r["all_reduce_total"] == sum(x["drawn"] for x in run.ranks)


def test_bench_times_the_engines_window_on_data_sized_for_it():
    """8 images cannot hold the warm-up (2 batches) and 10 timed steps of batch 4 in quick mode:
    the rank makes its epoch 12 batches long, and the engine times exactly 10 of them."""
    run = launch("bench", {"n_images": 8, "batch_size": 4, "image_size": 16, "min_side": 32,
                           "max_side": 48, "num_workers": 0}, nproc=1, timeout_s=200)
    rank = run.ranks[0]
    assert len(rank["step_times"]) == len(rank["step_samples"]) == MIN_TIMED_BATCHES
    assert rank["samples"] == sum(rank["step_samples"]) == 4 * MIN_TIMED_BATCHES
    assert 0 <= rank["wait_fraction"] <= 1 and rank["cpu_s"] > 0


def test_a_crashing_rank_gives_its_traceback():
    with pytest.raises(DistributedError) as info:
        launch("fail", {"rank": 1}, nproc=2, timeout_s=120)
    err = info.value
    assert "failed on purpose" in str(err) and 1 in err.rank_errors and not err.timed_out
    assert "rank(s) [1] raised an error" in str(err)


def test_a_stuck_rank_is_killed_at_the_timeout(monkeypatch):
    """Rank 0's loader never returns (tests/_ddp_tasks.py); every process of the launch, found
    by a marker in its environment, is gone after the DistributedError."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv("COURSE_TEST_LAUNCH", marker)
    t0 = time.perf_counter()
    with pytest.raises(DistributedError, match="did not finish within timeout_s=5") as info:
        launch("learner", {"module": "_ddp_tasks", "name": "hang_on_rank0", "n": 4}, nproc=2,
               timeout_s=5, pythonpath=[str(Path(__file__).parent)])
    assert info.value.timed_out and time.perf_counter() - t0 < 40
    time.sleep(0.5)
    leftovers = []
    for p in psutil.process_iter(["environ"]):
        if (p.info["environ"] or {}).get("COURSE_TEST_LAUNCH") == marker and p.pid != os.getpid():
            leftovers.append(p)
    assert not leftovers
