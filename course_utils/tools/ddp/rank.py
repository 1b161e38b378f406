"""The program every rank runs: ``python -m course_utils.tools.ddp.rank TASK --config F --out DIR``.

Started through ``torchrun`` by :func:`course_utils.tools.ddp.launch.launch`. Each rank joins
the process group (gloo on CPU, nccl with one GPU per rank), runs its task and writes what it saw
to ``DIR/rank{RANK}.json``; on an error it writes the traceback to ``DIR/rank{RANK}.error.txt``
and exits non-zero (torchrun then stops the other ranks). Tasks (config: a JSON dict):

* ``sampler`` — draw an :class:`~course_utils.lessons.l07_scaling_out.IndexDataset` through
  ``DistributedSampler`` for several *variants* (shuffle, seed, drop_last, set_epoch or not,
  workers and start method), recording the indices of each epoch in order (lesson 07);
* ``bench`` — a tiny DDP model trained on JPEGs decoded in the rank's DataLoader workers: step
  times, time waiting for data, CPU time of the rank's process tree (lesson 07's ``measure_ddp``);
* ``learner`` — what a learner's ``make_epoch_loader``, imported from the module the grader
  wrote, draws each epoch (exercise 07);
* ``fail`` / ``sleep`` — a rank that raises, or one that never finishes: the launcher's error paths.

Every rank also records its thread pools at start (``torchrun`` sets ``OMP_NUM_THREADS=1`` for
each rank when it starts more than one and the variable is not set).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.data import JpegDataset, ToTensorUint8
from course_utils.lessons.l07_scaling_out import IndexDataset, indices_of
from course_utils.process_tree import TreeMonitor
from course_utils.threads import make_worker_init, thread_pools


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"{name} is not set: run this module through torchrun "
                           f"(course_utils.tools.ddp.launch.launch), not directly.")
    return int(value)


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------

def _sampler(cfg: dict, rank: int, world: int) -> dict:
    dataset = IndexDataset(int(cfg.get("n", 10)))
    variants = {}
    drawn = 0
    for v in cfg.get("variants", [{"name": "default"}]):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                     shuffle=bool(v.get("shuffle", True)),
                                     seed=rank if v.get("seed") == "rank" else int(v.get("seed", 0)),
                                     drop_last=bool(v.get("drop_last", False)))
        workers = int(v.get("num_workers", 0))
        loader = DataLoader(dataset, batch_size=int(v.get("batch_size", 4)), sampler=sampler,
                            num_workers=workers,
                            multiprocessing_context=v.get("start_method") if workers else None,
                            timeout=60 if workers else 0)
        calls = []
        for epoch in v.get("epochs", [0, 1]):
            if v.get("set_epoch", True):
                sampler.set_epoch(int(epoch))
            calls.append({"epoch": int(epoch), "indices": indices_of(loader)})
        variants[str(v.get("name", len(variants)))] = calls
        drawn += sum(len(c["indices"]) for c in calls)
    total = torch.tensor([drawn])
    dist.all_reduce(total)  # the process group works: every rank learns the sum over ranks
    return {"n": len(dataset), "variants": variants, "drawn": drawn,
            "all_reduce_total": int(total.item())}


def _bench(cfg: dict, rank: int, world: int, local_rank: int, backend: str) -> dict:
    if cfg.get("rank_threads"):
        torch.set_num_threads(int(cfg["rank_threads"]))
    device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
    dataset = JpegDataset(int(cfg.get("n_images", 256)), min_side=int(cfg.get("min_side", 256)),
                          max_side=int(cfg.get("max_side", 512)),
                          transform=ToTensorUint8(int(cfg.get("image_size", 64))), progress=False)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    workers = int(cfg.get("num_workers", 0))
    loader = DataLoader(dataset, batch_size=int(cfg.get("batch_size", 16)), sampler=sampler,
                        num_workers=workers,
                        worker_init_fn=make_worker_init(1) if workers else None,
                        multiprocessing_context=cfg.get("start_method") if workers else None,
                        timeout=120 if workers else 0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step(batch) -> None:
        images, labels = batch
        x = images.to(device, non_blocking=True).float().div_(255)
        loss = loss_fn(ddp(x), labels.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n_batches = len(loader)
    warm = min(int(cfg.get("warmup_steps", max(2, 2 * workers))), n_batches // 2)
    it = iter(loader)
    for _ in range(warm):
        step(next(it))
    monitor = TreeMonitor()
    dist.barrier()  # every rank starts the clock together
    before = monitor.snapshot(fresh=True)
    waits, steps, sizes = [], [], []
    # Stop the clock while the workers still hold as many batches ahead as when it started
    # (workers x prefetch_factor): batches made before the window then balance those made in
    # it for later, instead of counting as free (see course_utils.timing, "A caveat").
    for _ in range(max(1, n_batches - warm - workers * 2)):
        a = time.perf_counter()
        batch = next(it)
        b = time.perf_counter()
        step(batch)
        waits.append(b - a)
        steps.append(time.perf_counter() - a)
        sizes.append(int(batch[1].shape[0]))
    cpu_s, _ = monitor.window(before, monitor.snapshot(fresh=True))
    del it
    return {"samples": sum(sizes), "cpu_s": cpu_s, "wait_fraction": sum(waits) / sum(steps),
            "step_times": steps, "step_samples": sizes, "pools": thread_pools().to_dict()}


def _learner(cfg: dict, rank: int, world: int) -> dict:
    module = importlib.import_module(cfg["module"])
    make_loader = getattr(module, cfg["name"])
    dataset = IndexDataset(int(cfg["n"]))
    calls = []
    for epoch in cfg.get("epochs", [0, 1, 2, 1]):
        loader = make_loader(dataset, int(epoch), rank, world)
        calls.append({"epoch": int(epoch), "indices": indices_of(loader)})
    return {"n": len(dataset), "epochs": calls}


def _fail(cfg: dict, rank: int) -> dict:
    if rank == int(cfg.get("rank", 1)):
        raise RuntimeError(f"rank {rank} failed on purpose (task 'fail')")
    if cfg.get("wait_s"):
        time.sleep(float(cfg["wait_s"]))
    return {}


def _sleep(cfg: dict, rank: int) -> dict:
    if rank == int(cfg.get("rank", rank)):
        time.sleep(float(cfg.get("seconds", 3600)))
    return {}


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tools.ddp.rank")
    parser.add_argument("task")
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    rank = int(os.environ.get("RANK", "0"))
    try:
        rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
        omp_env = os.environ.get("OMP_NUM_THREADS")
        cfg = json.loads(Path(args.config).read_text())
        record = {"rank": rank, "world_size": world, "local_rank": local_rank, "pid": os.getpid(),
                  "backend": args.backend, "task": args.task, "omp_num_threads_env": omp_env,
                  "pools_at_start": thread_pools().to_dict()}
        if args.task == "fail" and cfg.get("when") == "before_init":
            _fail(cfg, rank)
        if args.backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(args.backend, timeout=timedelta(seconds=max(10.0, args.timeout_s)))
        if args.task == "sampler":
            record.update(_sampler(cfg, rank, world))
        elif args.task == "bench":
            record.update(_bench(cfg, rank, world, local_rank, args.backend))
        elif args.task == "learner":
            record.update(_learner(cfg, rank, world))
        elif args.task == "fail":
            record.update(_fail(cfg, rank))
        elif args.task == "sleep":
            record.update(_sleep(cfg, rank))
        else:
            raise ValueError(f"unknown task {args.task!r}")
        tmp = out / f"rank{rank}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(out / f"rank{rank}.json")
        return 0
    except BaseException:
        text = traceback.format_exc()
        try:
            (out / f"rank{rank}.error.txt").write_text(text)
        except OSError:
            pass
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
