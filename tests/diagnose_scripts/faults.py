"""A script that goes wrong in one of several ways (--fault), after a few batches (--at)."""
import argparse
import resource
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["raise", "exit", "no-loader", "ranks", "hang", "forever",
                                                       "descriptors"],
                        required=True)
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--at", type=int, default=5, help="the step that raises or exits")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if args.fault == "no-loader":
        time.sleep(0.2)
        print("trained without a DataLoader")
        return
    if args.fault == "ranks":
        torch.multiprocessing.spawn(print, nprocs=2)
    if args.fault == "descriptors":           # lesson 09: 16 tensors a sample, every batch kept,
        torch.multiprocessing.set_sharing_strategy("file_descriptor")   # one descriptor a tensor
        many = [[torch.full((4,), i) for _ in range(16)] for i in range(4000)]
        kept, it = [], iter(DataLoader(many, batch_size=8, num_workers=2, collate_fn=list))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        for batch in it:
            kept.append(batch)
    loader = DataLoader(TensorDataset(torch.zeros(64, 4)), batch_size=2, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    while args.fault == "forever":            # epochs until stopped, its worker alive throughout
        for (batch,) in loader:
            time.sleep(0.01)
    for k, (batch,) in enumerate(loader):
        time.sleep(0.01)
        if k == args.at and args.fault == "raise":
            raise RuntimeError("the model diverged (a loss of nan)")
        if k == args.at and args.fault == "exit":
            sys.exit(args.code)
    if args.fault == "hang":
        time.sleep(3600)


if __name__ == "__main__":
    main()
