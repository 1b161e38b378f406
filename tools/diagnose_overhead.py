"""What ``diagnose train.py`` costs the loop it times: per batch, with and without the probe.

Two loops, each timed plain and under :class:`~course_utils.tools.diagnose.probe.Probe`, repeats
interleaved so a drift of the machine hits both alike: a loader of tiny batches in the main
process with no step (the probe's cost alone, microseconds per batch), and a loader with one
worker in front of a 1 ms step (the cost as a share of a small real loop). The target is the
larger of 1 % of the loop and 20 us per batch.

    python tools/diagnose_overhead.py [--batches N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from course_utils.tools.diagnose.probe import Probe

TARGET_SHARE, TARGET_S = 0.01, 20e-6


def _loop_s(loader: DataLoader, batches: int, step_s: float) -> float:
    """Seconds per batch of ``for batch in loader`` (epochs repeated) with a busy-wait step."""
    done, t0 = 0, time.perf_counter()
    while done < batches:
        for _ in loader:
            if step_s:
                end = time.perf_counter() + step_s
                while time.perf_counter() < end:
                    pass
            done += 1
            if done == batches:
                break
    return (time.perf_counter() - t0) / batches


def measure(batches: int, repeats: int) -> list[dict]:
    """Per loop: median seconds per batch plain and probed, the overhead, and the target."""
    tiny = TensorDataset(torch.zeros(4096, 4))
    loops = {"main process, tiny batches, no step": (lambda: DataLoader(tiny, batch_size=2), 0.0),
             "1 worker, 1 ms step": (lambda: DataLoader(tiny, batch_size=2, num_workers=1,
                                                        persistent_workers=True), 1e-3)}
    rows = []
    for label, (make, step_s) in loops.items():
        plain, probed = [], []
        for _ in range(repeats):
            plain.append(_loop_s(make(), batches, step_s))
            probe = Probe(budget_s=3600)
            probe.install()
            try:
                probed.append(_loop_s(make(), batches, step_s))
            finally:
                probe.stop()
                probe.uninstall()
        a, b = statistics.median(plain), statistics.median(probed)
        rows.append({"loop": label, "plain_s": a, "probed_s": b, "overhead_s": b - a,
                     "share": (b - a) / a, "target_s": max(TARGET_SHARE * a, TARGET_S),
                     "met": b - a <= max(TARGET_SHARE * a, TARGET_S)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per side, interleaved")
    args = parser.parse_args()
    for r in measure(args.batches, args.repeats):
        print(f"{r['loop']:<38} plain {r['plain_s'] * 1e6:8.1f} us/batch, probed "
              f"{r['probed_s'] * 1e6:8.1f}: overhead {r['overhead_s'] * 1e6:6.1f} us "
              f"({r['share']:+.1%}); target <= {r['target_s'] * 1e6:.1f} us: "
              f"{'met' if r['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
