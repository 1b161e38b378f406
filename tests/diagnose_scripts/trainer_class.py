"""A trainer class, as Lightning-style code has it: the loader is built in __init__, the loop is
a method, workers persist across short epochs. Cheap samples and a slow step: compute-bound."""
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, step_ms):
        data = TensorDataset(torch.randn(128, 3, 8, 8), torch.arange(128) % 10)
        self.loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=1,
                                 persistent_workers=True)
        self.model = torch.nn.Linear(3 * 8 * 8, 10)
        self.step_s = step_ms / 1e3
        self.epochs_done = 0

    def train_epoch(self):
        for images, labels in self.loader:
            time.sleep(self.step_s)
            torch.nn.functional.cross_entropy(self.model(images.flatten(1)), labels).backward()
        self.epochs_done += 1

    def fit(self, epochs):
        for _ in range(epochs):
            self.train_epoch()


if __name__ == "__main__":
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    Trainer(step_ms=100).fit(epochs)
    sys.exit(0)
