"""A Lightning-style trainer: it validates before it trains (a short loader of 6 batches, as a
sanity check or a first evaluation), then trains long epochs on a loader of its own."""
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


class LitTrainer:
    def __init__(self):
        self.model = torch.nn.Linear(16, 2)
        self.train_loader = DataLoader(TensorDataset(torch.randn(4000, 16), torch.arange(4000) % 2),
                                       batch_size=8, shuffle=True)
        self.val_loader = DataLoader(TensorDataset(torch.randn(48, 16), torch.arange(48) % 2),
                                     batch_size=8)

    def validate(self):
        with torch.no_grad():
            return sum(int((self.model(x).argmax(1) == y).sum()) for x, y in self.val_loader)

    def fit(self, epochs=100):
        print(f"validation before training: {self.validate()} of 48")
        for _ in range(epochs):
            for x, y in self.train_loader:
                time.sleep(0.02)                       # the step: 500 a 10 s epoch
                torch.nn.functional.cross_entropy(self.model(x), y).backward()
            print(f"validation: {self.validate()} of 48")


if __name__ == "__main__":
    LitTrainer().fit()
