"""A learner's training script as people write it: argparse, main(), a training and a validation
loader, epochs. Its samples cost --sample-ms each to load (asleep, as if reading a file, or with
--spin computing) and its step --step-ms, so the test that runs it knows which side should win."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowSamples(Dataset):
    def __init__(self, n, sample_ms, spin=False):
        self.n, self.sample_s, self.spin = n, sample_ms / 1e3, spin

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.sample_s
        while self.spin and time.perf_counter() < end:
            pass
        time.sleep(max(0.0, end - time.perf_counter()))
        return torch.full((3, 8, 8), float(i)), i % 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--sample-ms", type=float, default=2.0)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--spin", action="store_true", help="samples cost CPU, not a sleep")
    parser.add_argument("--start", default=None, help="the workers' start method")
    args = parser.parse_args()
    train = DataLoader(SlowSamples(64, args.sample_ms, args.spin), batch_size=8, shuffle=True,
                       num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0,
                       multiprocessing_context=args.start if args.workers else None)
    val = DataLoader(SlowSamples(16, args.sample_ms), batch_size=8, num_workers=0)
    model = torch.nn.Linear(3 * 8 * 8, 10)
    for epoch in range(args.epochs):
        for images, labels in train:
            time.sleep(args.step_ms / 1e3)
            model(images.flatten(1)).sum()
        with torch.no_grad():
            for images, labels in val:
                model(images.flatten(1))
        print(f"epoch {epoch} done")


if __name__ == "__main__":
    main()
