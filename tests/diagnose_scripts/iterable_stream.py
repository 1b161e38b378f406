"""An IterableDataset that streams samples (as webdataset-style readers do), each costing a few
milliseconds, in front of a quick step: data-bound. Each worker streams its own share."""
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __init__(self, n, sample_ms):
        self.n, self.sample_s = n, sample_ms / 1e3

    def __iter__(self):
        info = get_worker_info()
        ids = range(self.n) if info is None else range(info.id, self.n, info.num_workers)
        for i in ids:
            time.sleep(self.sample_s)
            yield torch.zeros(3, 8, 8), i % 10


def main():
    loader = DataLoader(Stream(10_000, 3.0), batch_size=8, num_workers=1)
    for images, labels in loader:
        images.sum()


if __name__ == "__main__":
    main()
