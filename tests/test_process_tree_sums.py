"""Tests for course_utils.process_tree: the sums TreeMonitor reports (CPU seconds with reaped
children, involuntary context switches over every thread and over processes that come and go,
summed USS/PSS peaks) and the sampler's pacing, on hand-made fake processes and a fake /proc, so
every figure is worked out by hand below and nothing depends on this machine's load."""
from __future__ import annotations

import contextlib
from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest

from course_utils import process_tree
from course_utils.process_tree import TreeMonitor, _involuntary_switches

Times = namedtuple("Times", "user system children_user children_system")
BareTimes = namedtuple("BareTimes", "user system")          # a platform without children's times
Ctx = namedtuple("Ctx", "voluntary involuntary")
Mem = namedtuple("Mem", "rss uss pss")
UssOnly = namedtuple("UssOnly", "rss uss")                  # a platform without PSS (macOS)
PssOnly = namedtuple("PssOnly", "rss pss")


class FakeProc:
    """A psutil.Process stand-in: fixed CPU times, context switches, memory and children."""

    def __init__(self, pid, times=Times(0.0, 0.0, 0.0, 0.0), ctx=Ctx(0, 0), mem=None,
                 children=(), descendants=None, gone=False, denied=False, created=1000.0):
        self.pid, self.times, self.ctx, self.mem = pid, times, ctx, mem
        self._children = list(children)
        self._descendants = list(children) if descendants is None else list(descendants)
        self.gone, self.denied, self.created = gone, denied, created

    def oneshot(self):
        return contextlib.nullcontext()

    def create_time(self):
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)
        return self.created

    def cpu_times(self):
        return self.times

    def num_ctx_switches(self):
        if self.denied:
            raise psutil.AccessDenied(self.pid)
        return self.ctx

    def memory_full_info(self):
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)
        if self.denied:
            raise psutil.AccessDenied(self.pid)
        return self.mem

    def children(self, recursive=False):
        return list(self._descendants if recursive else self._children)


@pytest.fixture
def no_proc(monkeypatch):
    """/proc's per-thread counts: none (as off Linux), so num_ctx_switches is what is read."""
    monkeypatch.setattr(process_tree, "_involuntary_switches", lambda pid: None)


def _key(p):
    return (p.pid, p.created)


# ---------------------------------------------------------------------------------------
# /proc: involuntary switches of every thread
# ---------------------------------------------------------------------------------------

STATUS = "Name:\tpython\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{invol}\n"


def _fake_proc_dir(monkeypatch, tmp_path, pid, files):
    """/proc/PID/task/*/status as the files given (name -> text, None: a thread that ended
    between the listing and the read)."""
    paths = []
    for name, text in files.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        paths.append(str(path))
    listing = {f"/proc/{pid}/task/*/status": paths}
    monkeypatch.setattr(process_tree, "glob", SimpleNamespace(glob=lambda pattern: listing.get(pattern, [])))


def test_involuntary_switches_add_up_every_thread_not_the_voluntary_ones(monkeypatch, tmp_path):
    _fake_proc_dir(monkeypatch, tmp_path, 4242, {
        "t1": STATUS.format(vol=1000, invol=7),
        "t2": STATUS.format(vol=2000, invol=5),
        "t3": STATUS.format(vol=3000, invol=30)})
    assert _involuntary_switches(4242) == 42            # 7 + 5 + 30 (never the voluntary 6000)


def test_a_process_without_proc_threads_reads_none(monkeypatch, tmp_path):
    _fake_proc_dir(monkeypatch, tmp_path, 4242, {"t1": STATUS.format(vol=1, invol=9)})
    assert _involuntary_switches(999) is None            # no /proc/999/task: not Linux, or gone


@pytest.mark.parametrize("broken", [
    None,                                                # the thread ended: its file is gone (OSError)
    "Name:\tpython\nnonvoluntary_ctxt_switches:\tgone\n",   # a garbled count (ValueError)
    "Name:\tpython\nState:\tZ (zombie)\n",               # no count line at all (StopIteration)
], ids=["file-gone", "garbled", "no-count-line"])
def test_a_thread_that_cannot_be_read_is_skipped_and_the_others_still_add_up(monkeypatch, tmp_path, broken):
    _fake_proc_dir(monkeypatch, tmp_path, 77, {
        "a": STATUS.format(vol=3, invol=11), "b": broken, "c": STATUS.format(vol=4, invol=4)})
    assert _involuntary_switches(77) == 15               # 11 + 4; the broken thread adds nothing


# ---------------------------------------------------------------------------------------
# which processes are the tree
# ---------------------------------------------------------------------------------------

def test_without_roots_the_tree_is_this_process_and_all_its_descendants():
    grandchild = FakeProc(3)
    child = FakeProc(2)
    monitor = TreeMonitor()
    monitor._proc = FakeProc(1, children=[child], descendants=[child, grandchild])
    assert [p.pid for p in monitor.list_tree()] == [1, 2, 3]


def test_roots_narrow_the_tree_to_them_and_their_descendants_skipping_a_gone_root(monkeypatch):
    monitor = TreeMonitor()
    me = FakeProc(1, children=[FakeProc(50)])            # another loader's worker: not counted
    monitor._proc = me
    table = {10: FakeProc(10, children=[FakeProc(11)], descendants=[FakeProc(11), FakeProc(12)]),
             30: FakeProc(30)}

    def process(pid):
        if pid not in table:
            raise psutil.NoSuchProcess(pid)
        return table[pid]

    monkeypatch.setattr(psutil, "Process", process)
    monitor.roots = [10, 20, 30]                         # 20 exited before it was listed
    assert [p.pid for p in monitor.list_tree()] == [1, 10, 11, 12, 30]


# ---------------------------------------------------------------------------------------
# CPU seconds and context switches per process
# ---------------------------------------------------------------------------------------

def test_cpu_of_a_process_includes_its_reaped_childrens_user_and_system_time(no_proc):
    p = FakeProc(5, Times(user=1.0, system=0.5, children_user=0.25, children_system=0.125))
    monitor = TreeMonitor()
    cpu, _ = monitor._read_cpu([p])[_key(p)]
    assert cpu == pytest.approx(1.875)                   # 1 + 0.5 + 0.25 + 0.125


def test_cpu_without_childrens_fields_is_user_plus_system(no_proc):
    p = FakeProc(5, BareTimes(user=2.0, system=0.75))
    cpu, _ = TreeMonitor()._read_cpu([p])[_key(p)]
    assert cpu == pytest.approx(2.75)                    # 2 + 0.75, nothing added for children


def test_switches_come_from_proc_threads_when_readable(monkeypatch):
    # /proc says 7 over all threads; psutil's count (the main thread's only) says 3
    monkeypatch.setattr(process_tree, "_involuntary_switches", {101: 7}.get)
    p = FakeProc(101, ctx=Ctx(voluntary=50, involuntary=3))
    assert TreeMonitor()._read_cpu([p])[_key(p)][1] == 7


def test_switches_fall_back_to_psutils_involuntary_count_off_linux(no_proc):
    p = FakeProc(101, ctx=Ctx(voluntary=9, involuntary=5))
    assert TreeMonitor()._read_cpu([p])[_key(p)][1] == 5


def test_a_process_that_vanished_mid_listing_is_skipped_and_the_rest_still_read(no_proc):
    gone = FakeProc(1, gone=True)
    alive = FakeProc(2, Times(0.5, 0.25, 0.0, 0.0), Ctx(0, 4))
    snap = TreeMonitor()._read_cpu([gone, alive])
    assert snap == {_key(alive): (pytest.approx(0.75), 4)}


def test_switches_not_readable_make_the_count_unknown_not_zero(no_proc):
    denied = FakeProc(3, Times(1.0, 0.0, 0.0, 0.0), denied=True)
    other = FakeProc(4, Times(0.5, 0.0, 0.0, 0.0), Ctx(0, 6))
    monitor = TreeMonitor()
    start = {**monitor._read_cpu([denied, other]), "sampler_cpu_s": 0.0}
    assert start[_key(denied)] == (1.0, None) and start[_key(other)] == (0.5, None)
    end = {_key(denied): (1.5, None), _key(other): (1.25, None), "sampler_cpu_s": 0.0}
    cpu, ctx = monitor.window(start, end)
    assert cpu == pytest.approx(1.25) and ctx is None     # (1.5 - 1) + (1.25 - 0.5); ctx unknown


# ---------------------------------------------------------------------------------------
# a window between two snapshots
# ---------------------------------------------------------------------------------------

def test_window_cpu_is_the_trees_growth_minus_the_samplers_own():
    monitor = TreeMonitor()
    a, b = (1, 0.0), (2, 0.0)
    start = {a: (1.0, 0), b: (2.0, 0), "sampler_cpu_s": 0.25}
    end = {a: (1.5, 0), b: (2.75, 0), "sampler_cpu_s": 0.5}
    cpu, _ = monitor.window(start, end)
    assert cpu == pytest.approx(1.0)                     # (0.5 + 0.75) - (0.5 - 0.25)


def test_window_switches_add_each_process_growth_counting_new_and_vanished_ones():
    monitor = TreeMonitor()
    stay, quiet, born, died, unseen = (1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0), (5, 0.0)
    monitor._last_ctx[died] = 9        # the sampler saw it at 9 before it exited
    start = {stay: (0.0, 10), quiet: (0.0, 6), died: (0.0, 2), unseen: (0.0, 3), "sampler_cpu_s": 0.0}
    end = {stay: (0.0, 13), quiet: (0.0, 6), born: (0.0, 4), "sampler_cpu_s": 0.0}
    _, ctx = monitor.window(start, end)
    # stay 13 - 10 = 3, quiet 6 - 6 = 0, born 4 - 0 (new: from zero) = 4, died 9 - 2 = 7,
    # unseen: gone and never sampled after the start, so not counted -> 3 + 0 + 4 + 7 = 14
    assert ctx == 14


def test_a_count_that_went_down_adds_nothing():
    monitor = TreeMonitor()
    a, b = (1, 0.0), (2, 0.0)
    start = {a: (0.0, 8), b: (0.0, 1), "sampler_cpu_s": 0.0}
    end = {a: (0.0, 5), b: (0.0, 3), "sampler_cpu_s": 0.0}
    assert monitor.window(start, end)[1] == 2             # max(0, 5 - 8) + (3 - 1)


def test_window_cpu_never_goes_below_zero():
    monitor = TreeMonitor()
    a = (1, 0.0)
    # the sampler cost more than the tree's growth (a clock's granularity): 0.25 - 0.5 -> 0
    start = {a: (1.0, 0), "sampler_cpu_s": 0.0}
    end = {a: (1.25, 0), "sampler_cpu_s": 0.5}
    assert monitor.window(start, end)[0] == 0.0


def test_a_process_the_sampler_saw_before_it_exited_keeps_its_last_count(no_proc):
    worker = FakeProc(8, ctx=Ctx(0, 2))
    monitor = TreeMonitor()
    monitor.uss_available = monitor.pss_available = False
    monitor.list_tree = lambda: [worker]
    start = {**monitor._read_cpu([worker]), "sampler_cpu_s": 0.0}
    worker.ctx = Ctx(0, 9)
    monitor._sample_once()                               # the sampler reads 9, then it exits
    end = {"sampler_cpu_s": monitor._sampler_cpu_s}
    assert monitor.window(start, end)[1] == 7            # 9 - 2


# ---------------------------------------------------------------------------------------
# snapshots: the listed tree, or a fresh listing
# ---------------------------------------------------------------------------------------

def test_snapshot_reads_the_processes_listed_at_start_unless_asked_for_a_fresh_listing(no_proc):
    listed, later = FakeProc(1, Times(1.0, 0, 0, 0)), FakeProc(2, Times(2.0, 0, 0, 0))
    monitor = TreeMonitor()
    monitor.uss_available = monitor.pss_available = False
    monitor.list_tree = lambda: [listed, later]          # what a listing would find now
    monitor._run = lambda: None                          # no sampler thread in this test
    monitor.start([listed])
    try:
        assert set(monitor.snapshot()) == {_key(listed), "sampler_cpu_s"}
        assert set(monitor.snapshot(fresh=True)) == {_key(listed), _key(later), "sampler_cpu_s"}
    finally:
        monitor.stop()


def test_a_new_monitor_reads_this_process_and_no_sampler_time_or_peaks():
    monitor = TreeMonitor()
    snap = monitor.snapshot()
    me = psutil.Process()
    assert set(snap) == {(me.pid, me.create_time()), "sampler_cpu_s"}
    assert snap["sampler_cpu_s"] == 0.0
    assert monitor.peaks() == (None, None)


# ---------------------------------------------------------------------------------------
# memory: summed USS and PSS, their peak, and what is unreadable
# ---------------------------------------------------------------------------------------

def test_memory_is_summed_over_the_tree_and_its_peak_kept():
    monitor = TreeMonitor()
    a = FakeProc(1, mem=Mem(rss=900, uss=100, pss=150))
    b = FakeProc(2, mem=Mem(rss=900, uss=0, pss=40))     # nothing private: adds 0, not 1
    monitor._sample_memory([a, b])
    assert monitor.peaks() == (100, 190)                 # USS 100 + 0, PSS 150 + 40
    a.mem, b.mem = Mem(900, 30, 60), Mem(900, 20, 70)
    monitor._sample_memory([a, b])                       # smaller now (50, 130): the peak stays
    assert monitor.peaks() == (100, 190)
    a.mem = Mem(900, 300, 200)
    monitor._sample_memory([a, b])
    assert monitor.peaks() == (320, 270)                 # 300 + 20, 200 + 70


def test_a_tree_using_no_memory_peaks_at_zero_bytes():
    monitor = TreeMonitor()
    monitor._sample_memory([FakeProc(1, mem=Mem(0, 0, 0))])
    assert monitor.peaks() == (0, 0)


def test_a_process_gone_before_its_memory_read_is_skipped_not_the_rest():
    monitor = TreeMonitor()
    monitor._sample_memory([FakeProc(1, gone=True), FakeProc(2, mem=Mem(1, 10, 20)),
                            FakeProc(3, mem=Mem(1, 5, 7))])
    assert monitor.peaks() == (15, 27)


def test_memory_unreadable_later_makes_both_peaks_unknown():
    monitor = TreeMonitor()
    p = FakeProc(1, mem=Mem(1, 100, 200))
    monitor._sample_memory([p])
    p.denied = True
    monitor._sample_memory([p])
    assert monitor.peaks() == (None, None)               # a peak that missed samples is no peak


@pytest.mark.parametrize("infos, peaks", [
    ([UssOnly(1, 10), UssOnly(1, 5)], (15, None)),       # no PSS on this platform
    ([PssOnly(1, 10), PssOnly(1, 5)], (None, 15)),       # no USS
    ([Mem(1, None, 3), Mem(1, 10, 4)], (None, 7)),       # one process's USS unknown: no sum
    ([Mem(1, 3, None), Mem(1, 4, 10)], (7, None)),       # one process's PSS unknown: no sum
])
def test_a_figure_any_process_lacks_is_unknown_and_the_other_still_summed(infos, peaks):
    monitor = TreeMonitor()
    monitor._sample_memory([FakeProc(i, mem=m) for i, m in enumerate(infos)])
    assert monitor.peaks() == peaks


def test_the_sampler_still_reads_pss_when_only_uss_is_unavailable(no_proc):
    monitor = TreeMonitor()
    monitor.uss_available = False
    monitor.list_tree = lambda: [FakeProc(1, mem=Mem(1, 10, 20))]
    monitor._sample_once()
    assert monitor.peaks() == (None, 20)


# ---------------------------------------------------------------------------------------
# the sampler's own cost and pace
# ---------------------------------------------------------------------------------------

class FakeTime:
    """process_tree's ``time``: perf_counter and thread_time read from planned lists."""

    def __init__(self, perf, thread):
        self.perf, self.thread = list(perf), list(thread)

    def perf_counter(self):
        return self.perf.pop(0)

    def thread_time(self):
        return self.thread.pop(0)


class FakeStop:
    """The stop event: records each wait's timeout; set after ``rounds`` waits."""

    def __init__(self, rounds):
        self.rounds, self.waits = rounds, []

    def wait(self, timeout):
        self.waits.append(timeout)
        return len(self.waits) > self.rounds


def test_the_samplers_cpu_time_adds_up_over_samples(monkeypatch, no_proc):
    monitor = TreeMonitor()
    monitor.uss_available = monitor.pss_available = False
    monitor.list_tree = lambda: []
    # sample 1: thread time 10.0 -> 10.25 (0.25 s), sample 2: 11.0 -> 11.5 (0.5 s)
    monkeypatch.setattr(process_tree, "time", FakeTime([0.0, 0.1, 1.0, 1.1], [10.0, 10.25, 11.0, 11.5]))
    monitor._sample_once()
    monitor._sample_once()
    assert monitor.snapshot()["sampler_cpu_s"] == pytest.approx(0.75)     # 0.25 + 0.5


def test_the_sampler_waits_a_tenth_of_a_second_then_twenty_times_a_slow_samples_cost(monkeypatch, no_proc):
    monitor = TreeMonitor()
    monitor.uss_available = monitor.pss_available = False
    monitor.list_tree = lambda: []
    monitor._stop = FakeStop(rounds=2)
    # sample 1 costs 0.01 s (5.0 -> 5.01), sample 2 costs 0.002 s (6.0 -> 6.002)
    monkeypatch.setattr(process_tree, "time", FakeTime([5.0, 5.01, 6.0, 6.002], [0.0, 0.0, 0.0, 0.0]))
    monitor._run()
    # before any sample: 0.1 s; after the 0.01 s one: 20 x 0.01 = 0.2 s; after 0.002 s: 20 x 0.002
    # = 0.04 s, below the 0.1 s floor -> 0.1 s
    assert monitor._stop.waits == [0.1, pytest.approx(0.2), 0.1]
