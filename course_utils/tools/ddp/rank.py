"""The program every rank runs: ``python -m course_utils.tools.ddp.rank TASK --config F --out DIR``,
started by torchrun from :func:`course_utils.tools.ddp.launch.launch`.

Each rank joins the process group, runs its task on the JSON config and writes its record, with its
thread pools at start (torchrun sets ``OMP_NUM_THREADS=1`` when ``--nproc-per-node`` > 1 and it is
unset), to ``DIR/rank{RANK}.json``, or its traceback to ``DIR/rank{RANK}.error.txt``. Tasks:

* ``sampler``: the indices each epoch of ``DistributedSampler`` drew over an ``IndexDataset``, in
  order, for each *variant* (shuffle, seed, drop_last, set_epoch, workers, start method; lesson 07);
* ``bench``: a tiny DDP model trained on JPEGs decoded in the rank's workers, timed by
  :func:`~course_utils.timing.measure_data_wait` (lesson 07's ``measure_ddp``);
* ``learner``: what ``make_loader(dataset, epoch, rank, world_size)``, named by ``module`` and
  ``name``, draws each epoch (exercise 07);
* ``fail``: rank ``rank`` raises before joining the group (lesson 07 shows the error)."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.data import JpegDataset, ToTensorUint8
from course_utils.lessons.l07_scaling_out import IndexDataset, indices_of
from course_utils.process_tree import TreeMonitor
from course_utils.start_methods import worker_timeout
from course_utils.threads import make_worker_init, thread_pools
from course_utils.timing import MIN_TIMED_BATCHES, default_warmup, measure_data_wait

from .launch import TASKS


def _device(backend: str, local_rank: int) -> torch.device:
    """Where a rank's tensors for collectives live: nccl reduces CUDA tensors only, gloo CPU ones."""
    return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")


def _sampler(cfg: dict, rank: int, world: int, local_rank: int, backend: str) -> dict:
    dataset, variants, drawn = IndexDataset(int(cfg.get("n", 10))), {}, 0
    for v in cfg.get("variants", [{"name": "default"}]):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                     shuffle=bool(v.get("shuffle", True)),
                                     seed=rank if v.get("seed") == "rank" else int(v.get("seed", 0)),
                                     drop_last=bool(v.get("drop_last", False)))
        workers = int(v.get("num_workers", 0))
        context = v.get("start_method") if workers else None
        loader = DataLoader(dataset, batch_size=int(v.get("batch_size", 4)), sampler=sampler,
                            num_workers=workers, multiprocessing_context=context,
                            timeout=worker_timeout(60, context) if workers else 0)
        calls = []
        for epoch in map(int, v.get("epochs", [0, 1])):
            if v.get("set_epoch", True):
                sampler.set_epoch(epoch)
            calls.append({"epoch": epoch, "indices": indices_of(loader)})
        variants[str(v.get("name", len(variants)))] = calls
        drawn += sum(len(c["indices"]) for c in calls)
    total = torch.tensor([drawn], device=_device(backend, local_rank))
    dist.all_reduce(total)  # the process group works: every rank learns the sum over ranks
    return {"n": len(dataset), "variants": variants, "drawn": drawn, "all_reduce_total": int(total.item())}


def _bench(cfg: dict, rank: int, world: int, local_rank: int, backend: str) -> dict:
    """One epoch of this rank's shard through the engine's window (the batches in flight untimed,
    then the rest of the epoch; 10 steps in quick mode). ``step_times``: seconds per timed
    iteration (wait, copy included, + step); ``cpu_s``: CPU seconds of the rank and its workers."""
    if cfg.get("rank_threads"):
        torch.set_num_threads(int(cfg["rank_threads"]))
    device = _device(backend, local_rank)
    workers, batch_size = int(cfg.get("num_workers", 0)), int(cfg.get("batch_size", 16))
    warm = default_warmup(SimpleNamespace(num_workers=workers, prefetch_factor=None))
    # every rank's epoch holds the warm-up and an honest window: the engine refuses less
    n_images = max(int(cfg.get("n_images", 256)), world * batch_size * (warm + MIN_TIMED_BATCHES))
    dataset = JpegDataset(n_images, min_side=int(cfg.get("min_side", 256)),
                          max_side=int(cfg.get("max_side", 512)),
                          transform=ToTensorUint8(int(cfg.get("image_size", 64))), progress=False)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        worker_init_fn=make_worker_init(1) if workers else None,
                        multiprocessing_context=cfg.get("start_method") if workers else None,
                        timeout=120 if workers else 0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    monitor, start, sizes = TreeMonitor(), {}, []

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:    # on `device` already
        images, labels = batch
        loss = nn.functional.cross_entropy(ddp(images.float().div_(255)), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sizes.append(int(labels.shape[0]))
        if len(sizes) == warm:       # the last untimed step: every rank starts the clock together
            dist.barrier()
            start.update(monitor.snapshot(fresh=True))

    wait = measure_data_wait(loader, step, device=device)   # the copy counts as waiting
    cpu_s, _ = monitor.window(start, monitor.snapshot(fresh=True))   # the workers are reaped
    return {"samples": sum(sizes[warm:]), "cpu_s": cpu_s, "wait_fraction": wait.wait_fraction,
            "step_times": wait.iteration_s, "step_samples": sizes[warm:], "pools": thread_pools().to_dict()}


def _learner(cfg: dict, rank: int, world: int, *_: object) -> dict:
    make_loader = getattr(importlib.import_module(cfg["module"]), cfg["name"])
    dataset = IndexDataset(int(cfg["n"]))
    calls = [{"epoch": int(epoch), "indices": indices_of(make_loader(dataset, int(epoch), rank, world))}
             for epoch in cfg.get("epochs", [0, 1, 2, 1])]
    return {"n": len(dataset), "epochs": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tools.ddp.rank")
    parser.add_argument("task", choices=TASKS)
    for flag in ("--config", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    rank = int(os.environ.get("RANK", "0"))
    try:
        world, local_rank = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
        cfg = json.loads(Path(args.config).read_text())
        record = {"rank": rank, "world_size": world, "local_rank": local_rank, "pid": os.getpid(),
                  "backend": args.backend, "task": args.task,
                  "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
                  "pools_at_start": thread_pools().to_dict()}
        if args.task == "fail" and rank == int(cfg.get("rank", 1)):
            raise RuntimeError(f"rank {rank} failed on purpose (task 'fail')")
        if args.backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(args.backend, timeout=timedelta(seconds=max(10.0, args.timeout_s)))
        if args.task != "fail":
            task = {"sampler": _sampler, "bench": _bench, "learner": _learner}[args.task]
            record.update(task(cfg, rank, world, local_rank, args.backend))
        tmp = out / f"rank{rank}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(out / f"rank{rank}.json")
        return 0
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(OSError):
            (out / f"rank{rank}.error.txt").write_text(text)
        print(f"[rank {rank}] {text}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    code = main()
    # What the rank has to say is on disk (its record or its error), so it leaves at once, without
    # dist.destroy_process_group() or the interpreter's own teardown: with torch 2.3 and 2.5,
    # gloo's teardown hung, holding the GIL, in a rank whose peer had left (2 of 3 runs on 2.3;
    # 3 of 12 on 2.5 with the CPUs busy).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
