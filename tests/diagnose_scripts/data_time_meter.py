"""The pytorch/examples ImageNet pattern: an AverageMeter of the time each batch took to arrive
(``data_time``), written to --meter after every batch, so a test can compare it with diagnose."""
import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class AverageMeter:
    def __init__(self):
        self.values = []

    def update(self, value):
        self.values.append(value)


class Jittery(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        time.sleep(0.002 if i % 3 else 0.006)
        return torch.zeros(3, 8, 8), 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meter", required=True)
    args = parser.parse_args()
    data_time = AverageMeter()
    loader = DataLoader(Jittery(), batch_size=4, num_workers=1)
    end = time.perf_counter()
    for images, _ in loader:
        data_time.update(time.perf_counter() - end)
        time.sleep(0.004)                      # the step
        with open(args.meter, "w") as fh:
            json.dump(data_time.values, fh)
        end = time.perf_counter()


if __name__ == "__main__":
    main()
