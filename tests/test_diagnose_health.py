"""Pins diagnose's health section (issue 41): each figure against hand-worked numbers, each verdict
on both sides of its threshold, the four failures named, and bad input (a limit of 0, no /dev/shm,
no cgroup limit) read as what it is."""
from __future__ import annotations

import json
import resource
import sys

import pytest
import torch

from _helpers import DIAGNOSE_SCRIPTS as SCRIPTS, diagnose_cli as _cli

import course_utils.tools.diagnose.script as ds
from course_utils.tools.diagnose import health as H
from course_utils.tools.diagnose.rules import FAILURES, FIXES, GROWTH_SHARE, HEALTH_SHARE, health, named_failure

MIB = 2**20


def raw(workers=3, prefetch=2, batch_bytes=5 * MIB, tensors=7, shm_free=100 * MIB, at_start=40,
        peak=55, nofile=1024, sharing="file_descriptor", rss=((10 * MIB, 12 * MIB), (10 * MIB, 15 * MIB)),
        memory=1000 * MIB):
    return {"settings": {"num_workers": workers, "prefetch_factor": prefetch}, "batch_bytes": batch_bytes,
            "batch_tensors": tensors, "shm_free": shm_free, "fds": {"at_start": at_start, "peak": peak},
            "worker_rss": [list(r) for r in rss],
            "limits": {"nofile": nofile, "memory": memory, "memory_of": "the cgroup's memory limit",
                       "sharing": sharing}}


def rows(**kw):
    return {r["what"]: r for r in H.loader_health(raw(**kw))}


def test_the_rule_says_more_than_the_share_on_both_sides_and_at_it():
    assert HEALTH_SHARE == 0.5 and GROWTH_SHARE == 0.1
    assert health(51, 100) == "at risk" and health(50, 100) == "ok" and health(49, 100) == "ok"
    assert health(11, 100, 0.1) == "at risk" and health(10, 100, 0.1) == "ok"
    assert health(1, 0) == "at risk" and health(0, 0) == "ok"            # a limit of 0
    assert health(None, 100) == health(5, None) == "not measured"
    assert health(10**9, float("inf")) == "ok"                            # no limit at all


def test_shared_memory_in_flight_is_workers_times_prefetch_times_batch_bytes():
    r = rows()["shared memory in flight"]
    assert r["used"] == 3 * 2 * 5 * MIB and r["limit"] == 100 * MIB        # 30 MiB of 100: ok
    assert r["verdict"] == "ok" and "6 batches" in r["said"] and "30.0 MiB" in r["said"]
    tight = rows(shm_free=59 * MIB)["shared memory in flight"]             # 30 > 29.5
    assert tight["verdict"] == "at risk"
    assert rows(shm_free=60 * MIB)["shared memory in flight"]["verdict"] == "ok"   # exactly half
    assert rows(shm_free=None)["shared memory in flight"]["verdict"] == "not measured"  # no /dev/shm
    assert rows(workers=0, prefetch=None)["shared memory in flight"]["used"] == 0


def test_descriptors_in_flight_count_one_per_tensor_under_file_descriptor_sharing():
    r = rows()["descriptors"]
    assert r["used"] == 40 + 3 * 2 * 7 == 82 and r["verdict"] == "ok"     # of 1,024
    assert rows(nofile=163)["descriptors"]["verdict"] == "at risk"         # 82 > 81.5
    assert rows(nofile=164)["descriptors"]["verdict"] == "ok"              # 82 = half of 164
    by_name = rows(sharing="file_system")["descriptors"]                   # no descriptor per tensor
    assert by_name["used"] == 55 and "file_system" in by_name["said"]
    unlimited = rows(nofile=None)["descriptors"]
    assert unlimited["verdict"] == "ok" and unlimited["said"].endswith("soft limit none")


def test_memory_growth_sums_each_workers_last_minus_first_sample():
    r = rows()["workers' memory growth"]
    assert r["used"] == (12 - 10 + 15 - 10) * MIB and r["verdict"] == "ok"   # 7 MiB of 1000
    assert rows(memory=69 * MIB)["workers' memory growth"]["verdict"] == "at risk"   # 7 > 6.9
    assert rows(memory=70 * MIB)["workers' memory growth"]["verdict"] == "ok"
    assert rows(rss=())["workers' memory growth"]["verdict"] == "not measured"


def test_the_lines_give_the_fix_only_where_at_risk():
    timed = {"index": 0, "where": "train.py:9", "startup_s": 0.5, "warmup_batches": 2, "batches": 12,
             "epochs": 1, "samples": 80, "waits_s": [0.02] * 10, "steps_s": [0.01] * 10, "batch": "uint8",
             "wait_busy_s": 0.0, "epoch_start_wait_s": 0.0, "worker_busy_s": 0.2, "worker_wall_s": 1.0,
             "workers_seen": 3, "worker_threads": [2], "gpu_busy": None}
    settings = {"batch_size": 8, "pin_memory": False, "persistent_workers": False, "start_method": "fork",
                "dataset": "D", "transform": "None"}
    record = raw(shm_free=10 * MIB)
    record["settings"].update(settings)
    text = "\n".join(ds._loader_lines(ds.LoaderStats({**timed, **record}), True))
    assert "shared memory in flight" in text and "AT RISK; fix: fewer workers" in text
    assert text.count("fix:") == 1 and "descriptors: 40 open + 6 batches x 7 tensors" in text


def test_tensors_in_a_nested_batch_and_their_bytes():
    batch = (torch.zeros(4, 3, 2, 2, dtype=torch.uint8),
             [{"boxes": torch.zeros(2, 4), "labels": torch.zeros(2, dtype=torch.int64)}] * 2, "name")
    assert H.tensors_in(batch) == (5, 48 + 2 * (32 + 16))
    assert H.tensors_in(torch.zeros(3)) == (1, 12) and H.tensors_in("x") == (0, 0)


def test_limits_read_the_cgroup_and_fall_back_to_the_machine(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")                    # v2, no limit
    assert H.limits(str(tmp_path))["memory_of"] == "the machine's RAM"
    (tmp_path / "memory.max").write_text(f"{64 * MIB}\n")
    assert H.limits(str(tmp_path))["memory"] == 64 * MIB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{32 * MIB}\n")
    found = H.limits(str(v1))
    assert found["memory"] == 32 * MIB and found["memory_of"] == "the cgroup's memory limit"
    assert H.limits(str(tmp_path / "none"))["sharing"] == torch.multiprocessing.get_sharing_strategy()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert H.limits(str(tmp_path))["nofile"] == (None if soft == resource.RLIM_INFINITY else soft)


def test_no_shared_memory_filesystem_is_none_not_an_error(tmp_path):
    assert H.shm_free(str(tmp_path / "no_shm")) is None
    assert H.shm_free(str(tmp_path)) > 0


@pytest.mark.parametrize("error, name", [
    ("RuntimeError: unable to write to file </torch_1_2>: No space left on device (28)", "shared memory"),
    ("RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus error. It is possible that "
     "dataloader's workers are out of shared memory.", "shared memory"),
    ("OSError: [Errno 24] Too many open files", "too many open files"),
    ("RuntimeError: received 0 items of ancdata", "too many open files"),
    ("RuntimeError: DataLoader worker (pid 9) is killed by signal: Killed.", "worker killed"),
    ("RuntimeError: DataLoader worker (pid(s) 9) exited unexpectedly", "worker killed"),
    ("RuntimeError: DataLoader timed out after 5 seconds", "a hang"),
])
def test_the_four_failures_are_named(error, name):
    found = named_failure("Traceback (most recent call last):\n  ...\n" + error)
    assert found is not None and name in found[0] and found[1]


def test_other_errors_are_not_named():
    assert named_failure("ValueError: bad learning rate") is None and named_failure(None) is None
    assert len(FAILURES) == 4 and named_failure("Errno 24: Too many open files")[1] == FIXES["fds"]


@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file_descriptor sharing is Linux's")
def test_a_script_out_of_descriptors_is_named_in_one_line_instead_of_a_traceback(tmp_path):
    out_json = tmp_path / "d.json"
    run = _cli("--budget", "20", "--json", str(out_json), str(SCRIPTS / "faults.py"),
               "--fault", "descriptors")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the script died of too many open files" in run.stdout
    assert "fix: fewer tensors a batch, file_system sharing" in run.stdout and "Traceback" not in run.stderr
    assert json.loads(out_json.read_text())["failure"][0] == "too many open files"


@pytest.mark.timeout(180)
def test_a_measured_loader_with_workers_reports_its_health_in_text_and_json(tmp_path):
    out_json = tmp_path / "d.json"
    run = _cli("--budget", "8", "--try", "num_workers=2", "--json", str(out_json),
               str(SCRIPTS / "faults.py"), "--fault", "forever", "--workers", "2")
    assert "health (lesson 09):" in run.stdout, run.stdout + run.stderr
    loader = json.loads(out_json.read_text())["baseline"]["loaders"][0]
    found = {r["what"]: r for r in loader["health"]}
    # 2 workers x prefetch_factor 2 batches of one float32 (2, 4) tensor: 4 x 32 bytes
    assert loader["batch_bytes"] == 32 and loader["batch_tensors"] == 1
    assert found["shared memory in flight"]["used"] == 128
    assert {r["verdict"] for r in found.values()} <= {"ok", "not measured"}
