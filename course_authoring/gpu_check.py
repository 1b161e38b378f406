"""``python -m course_authoring gpu-check --out DIR``: the whole GPU check, as independent steps.

A GPU machine is lent rarely, for one run of at most 600 s whose output is shown only as its
last 12,000 characters. So the check is a list of steps (:func:`check_steps`), each a process of
its own with its own timeout (:mod:`course_authoring.step_runner`); the timeouts, every kill
escalation and the work outside the steps add up to at most :data:`LIMIT_S` (a test holds
this), a failure or timeout in one step is logged and the next runs, and the output ends with a
summary of every step and every failure. First a preflight line (:func:`preflight`: versions,
compilers, GPU modes, /dev/shm), kept in the summary; then the steps: ``doctor``; a
``torch.compile`` probe; lessons 04 and 05's GPU benchmarks in full mode (the reference
results, written into DIR: :data:`course_utils.reference.REFERENCE_NAMES`); notebooks 04, 05
and 08 in quick mode without Jupyter; the CUDA unit tests; ``tune``, one torchrun rank and
``diagnose`` in quick mode. Steps that only prove a path works run on at most
:data:`QUICK_CPUS` CPUs. ``/dev/shm`` is sized first (enlarged when root, else lessons 04 and 05
shrink their loaders).

Without CUDA it refuses and writes nothing, except with ``--rehearse``: every step of the same
check on the CPU, with the same timeouts, files, summary and exit status (lesson benchmarks at
quick sizes), its files marked as a rehearsal — never reference results. ``--part`` and
``--notebook`` are the steps' own entry points.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import psutil

from course_utils.config import QUICK_ENV
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, REFERENCE_NAMES, SUMMARY,
                                    describe_machine, load_reference, save_reference)

from .gpu_lesson05 import compile_probe
from .gpu_preflight import (optional_library_notes, preflight, preflight_line, preflight_warnings,
                            smi_step)
from .notebook_runner import run_notebook_cells
from .step_runner import (Step, StepResult, echo_to, run_steps, step_worst_s, summary_block,
                          worst_case_s)

__all__ = ["LIMIT_S", "IN_PROCESS_S", "QUICK_CPUS", "EXPECTED_TARGETS", "NOTEBOOKS",
           "GpuCheckRefused", "cuda_available", "host_memory", "memory_notes", "plan_shm",
           "in_process_worst_s", "check_steps", "run_part", "run_compile_probe",
           "run_notebook_step", "summarize", "format_targets", "run_check",
           "add_arguments", "cli", "main"]

#: The whole check's worst case in seconds (the device tool allows 600 s per call and 15 min in
#: all, a machine start of several minutes included: a second try must still fit).
LIMIT_S = 420
#: Seconds of the check spent outside its steps (imports, versions, memory, /dev/shm, the
#: summary: under 4 s in a CPU rehearsal), besides the preflight's nvidia-smi, counted as a step.
IN_PROCESS_S = 8
#: CPUs for the steps that only prove a path works (fewer DataLoader workers to start).
QUICK_CPUS = 8
#: The notebooks the check runs, in quick mode, each a step of its own with its timeout (quick
#: rehearsal on 2 CPUs: 11-16, 31, 23-28 s). Notebook 05 also compiles augment_batch on CUDA: its
#: cold compile is not measured yet; the probe's tiny function took 12.9-18 s cold, 3.3 s warm
#: (measured on a 2-CPU machine), and 05's step has 65 s for it.
NOTEBOOKS = {"04_host_to_device.ipynb": 25, "05_gpu_augmentation.ipynb": 65,
             "08_find_the_stall.ipynb": 36}
#: The torch.compile probe's step (a tiny function; its first call took 12.9-18 s cold, 3.3 s with
#: Inductor's cache warm, measured on a 2-CPU machine; the step up to 22 s with start-up).
COMPILE_S = 28
#: The DDP step's launch limit (measure_ddp's timeout_s: one rank's CUDA and NCCL set-up and its
#: epoch; 9 s in a CPU rehearsal) and the step's own timeout around it (python, imports, exit).
DDP_LAUNCH_S, DDP_STEP_S = 24, 30
#: Unit tests whose CUDA paths only a GPU runs.
UNIT_TESTS = ("tests/test_lesson04.py", "tests/test_augment.py", "tests/test_grader04.py",
              "tests/test_grader05.py")
#: The targets each benchmark part measures: one that is absent is reported as not measured.
EXPECTED_TARGETS = {"lesson04": ("pinned_h2d",), "lesson05": ("augment_speedup", "tuned_data_wait")}
#: (timeout, --budget) of the two benchmark parts: the budget leaves the timeout room for
#: python, torch and CUDA to start (a section that does not fit the budget is skipped, named).
PARTS = {"lesson04": (38, 28), "lesson05": (60, 48)}
#: About what lesson 05's full-size per-sample loaders (workers x prefetched float32 batches)
#: hold in /dev/shm at once, and tune's loaders beside them.
SHM_NEED_BYTES = 6 * 1024 ** 3
SHM_PATH = Path("/dev/shm")
ROOT = Path(__file__).resolve().parent.parent
GIB = 1024 ** 3
TAKES = "the device tool returns at most 8 files"


class GpuCheckRefused(RuntimeError):
    """The check cannot run here (no CUDA, no --rehearse); nothing was written."""


def cuda_available() -> bool:
    """True when torch sees a CUDA GPU. (Tests replace this function to simulate one.)"""
    import torch
    return bool(torch.cuda.is_available())


def _refusal() -> str:
    return ("gpu-check needs a CUDA GPU, and torch.cuda.is_available() is False here.\n"
            "Nothing was measured and nothing was written: reference GPU results are only ever "
            "measured on a real GPU, never made up.\n"
            "Run it on a machine with an NVIDIA GPU and a CUDA build of torch:\n"
            "    python -m course_authoring gpu-check --out DIR   # then copy the reference files\n"
            "or rehearse every step on this CPU (its files are marked, never references):\n"
            "    python -m course_authoring gpu-check --rehearse --out DIR")


def _gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


# ---- memory -----------------------------------------------------------------------------------

def host_memory(shm_path: Path = SHM_PATH) -> dict:
    """RAM available and free space in ``/dev/shm`` (where DataLoader workers put batches),
    in bytes; ``shm_free_bytes`` is None where there is no such folder."""
    ram = psutil.virtual_memory()
    try:
        usage = shutil.disk_usage(shm_path)
        shm_free, shm_total = int(usage.free), int(usage.total)
    except OSError:
        shm_free = shm_total = None
    return {"ram_available_bytes": int(ram.available), "ram_total_bytes": int(ram.total),
            "shm_free_bytes": shm_free, "shm_total_bytes": shm_total}


def memory_notes(memory: Mapping[str, Any]) -> tuple[list[str], bool]:
    """What the memory found means for this run, as lines for the log, and whether /dev/shm is
    too small for lesson 05's full-size loaders."""
    ram, shm = memory.get("ram_available_bytes"), memory.get("shm_free_bytes")
    notes = [f"RAM available {_gib(ram)}: lesson 04's bandwidth sweep sizes its largest copy from "
             f"it (at most 1 GiB, at most a quarter of the available RAM)"]
    short = shm is not None and shm < SHM_NEED_BYTES
    if shm is None:
        notes.append(f"{SHM_PATH} not found: DataLoader workers cannot share batches there")
    elif short:
        notes.append(f"WARNING: {SHM_PATH} has only {_gib(shm)} free; lesson 05's full-size "
                     f"loaders and tune's can hold about {_gib(SHM_NEED_BYTES)} there, so they "
                     f"run smaller (or give the machine more, e.g. docker --shm-size=8g)")
    else:
        notes.append(f"{SHM_PATH} has {_gib(shm)} free: enough for lesson 05's full-size loaders "
                     f"(about {_gib(SHM_NEED_BYTES)} at most)")
    return notes, short


def plan_shm(memory: Mapping[str, Any], *, rehearse: bool, is_root: bool,
             remount: Callable[[int], bool]) -> tuple[dict, list[str]]:
    """Make room in /dev/shm where it is short: as root, ``remount(size_bytes)`` enlarges it
    (not in a rehearsal: this machine's /dev/shm is left alone); the new ``memory`` and lines
    saying what was done. ``remount`` returns whether it worked."""
    free, total = memory.get("shm_free_bytes"), memory.get("shm_total_bytes")
    if free is None or free >= SHM_NEED_BYTES:
        return dict(memory), []
    size = int(math.ceil(((total or 0) + SHM_NEED_BYTES - free) / GIB)) * GIB
    if rehearse:
        return dict(memory), [f"rehearsal: {SHM_PATH} is short; a real run as root would remount it "
                              f"with size={size // GIB}G, here it is left alone"]
    if not is_root:
        return dict(memory), [f"{SHM_PATH} is short and this is not root: lesson 05 and tune run smaller"]
    if remount(size) and (after := host_memory()).get("shm_free_bytes", 0) >= SHM_NEED_BYTES:
        return after, [f"remounted {SHM_PATH} with size={size // GIB}G: now "
                       f"{_gib(after['shm_free_bytes'])} free"]
    return dict(memory), [f"could not enlarge {SHM_PATH} (mount -o remount,size={size // GIB}G "
                          f"failed): lesson 05 and tune run smaller"]


def _remount(size_bytes: int) -> bool:
    try:
        return subprocess.run(["mount", "-o", f"remount,size={size_bytes // GIB}G", str(SHM_PATH)],
                              capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def in_process_worst_s() -> float:
    """The longest the check spends outside its steps: :data:`IN_PROCESS_S` and the preflight's
    nvidia-smi query, every escalation of the step runner counted."""
    return IN_PROCESS_S + step_worst_s(smi_step())


# ---- the steps --------------------------------------------------------------------------------

_DDP = """from course_authoring.notebook_modules import notebook_module
from course_utils import usable_cpus
from course_utils.tools.ddp.launch import pick_backend
print('backend for 1 rank:', pick_backend(1))
ddp = notebook_module('07_scaling_out.ipynb', 'lesson07_ddp')  # the lesson's own measure_ddp
print(ddp.measure_ddp(1, num_workers=max(usable_cpus() - 1, 0), rank_threads=1, timeout_s=%d))""" % DDP_LAUNCH_S


def check_steps(out_dir: str | os.PathLike, *, python: str = sys.executable,
                rehearse: bool = False, shm_free_bytes: int | None = None) -> list[Step]:
    """The check's steps, in order, with their timeouts (seconds); runs nothing."""
    out, py = str(out_dir), str(python)
    quick = {QUICK_ENV: "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    me = [py, "-m", "course_authoring", "gpu-check"] + (["--rehearse"] if rehearse else [])
    short = shm_free_bytes is not None and shm_free_bytes < SHM_NEED_BYTES
    shm = [] if shm_free_bytes is None else ["--shm-bytes", str(shm_free_bytes)]
    steps = [Step("doctor", [py, "-m", "course_utils", "doctor"], 8),       # 2 s on 2 CPUs
             Step(f"torch.compile probe ({'cpu: rehearsal' if rehearse else 'cuda'})",
                  me + ["--compile-probe"], COMPILE_S, env=quick, max_cpus=QUICK_CPUS)]
    for part, (timeout, budget) in PARTS.items():
        argv = me + ["--part", part, "--out", out, "--budget", str(budget), *shm]
        steps.append(Step(f"{part} benchmarks ({'quick sizes: rehearsal' if rehearse else 'full mode'})",
                          argv, timeout, env={"PYTHONUNBUFFERED": "1"}))
    for name, timeout in NOTEBOOKS.items():
        steps.append(Step(f"notebook {name[:2]} (quick)", me + ["--notebook", f"notebooks/{name}"],
                          timeout, env=quick, max_cpus=QUICK_CPUS, where=r"^--- .* cell \d+"))
    steps.append(Step("unit tests (CUDA paths of lessons 04-05)",                # 8 s on 2 CPUs
                      [py, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", *UNIT_TESTS],
                      25, env=quick, max_cpus=QUICK_CPUS, where=r"::"))
    size = ["--images", "256", "--batch-size", "32"] if short else []
    steps.append(Step("lesson 06: tune (quick)", [py, "-m", "course_utils", "tune", "--budget", "15",
                                                  "--no-progress", *size, "--json",
                                                  f"{out}/tune_cuda.json"], 30, env=quick,
                      max_cpus=QUICK_CPUS))                                    # 21 s on 2 CPUs
    steps.append(Step("lesson 07: one torchrun rank (quick)", [py, "-c", _DDP], DDP_STEP_S, env=quick,
                      max_cpus=QUICK_CPUS))
    steps.append(Step("lesson 08: diagnose the example script, unchanged (quick)",
                      [py, "-m", "course_utils", "diagnose", "--budget", "8", "--no-progress",
                       "--json", f"{out}/diagnose_cuda.json",
                       "course_utils/tools/examples/data_bound.py", "--epochs", "1000"],
                      28, env=quick, max_cpus=QUICK_CPUS))
    for step in steps:
        step.cwd = str(ROOT)
    return steps


#: Files the check writes into --out: the log, the reference files, tune's and diagnose's.
OWN_FILES = ("gpu_check_log.txt", "tune_cuda.json", "diagnose_cuda.json")


# ---- one step's entry points -------------------------------------------------------------------

def _section_failures(result: Mapping) -> list[str]:
    """The sections of a benchmark result that raised (recorded as ``"failed: ..."`` in its
    ``skipped``, a dict of section -> reason, or a list of reasons)."""
    skipped = result.get("skipped") or {}
    if isinstance(skipped, Mapping):
        return [f"section {k}: {v}" for k, v in skipped.items() if str(v).startswith("failed")]
    return [str(v) for v in skipped if str(v).lower().startswith("failed")]


def _measure_part(part: str, budget_s: float, rehearse: bool, shm_bytes: int | None) -> dict:
    """lesson04/lesson05's benchmarks: full mode on CUDA; quick sizes on the CPU (rehearsal)."""
    device = "cpu" if rehearse else "cuda"
    os.environ[QUICK_ENV] = "1" if rehearse else "0"
    if part == "lesson04":
        from .gpu_lesson04 import run_lesson04    # the notebook's modules: only when it runs
        return run_lesson04(budget_s, device=device, shm_bytes=shm_bytes)
    from .gpu_lesson05 import run_lesson05
    return run_lesson05(budget_s, device=device, quick=rehearse, shm_bytes=shm_bytes)


def run_part(part: str, out_dir: str | os.PathLike, budget_s: float, *, rehearse: bool = False,
             shm_bytes: int | None = None, log: Callable[[str], None] = print,
             measure: Callable[..., dict] = _measure_part) -> int:
    """Run one benchmark part and write its JSON into ``out_dir``; 0 when no section raised,
    2 when one did (what was measured is still written), 1 when it is refused."""
    if not rehearse and not cuda_available():
        raise GpuCheckRefused(_refusal())
    ref = {"lesson04": LESSON04, "lesson05": LESSON05}[part]
    result = measure(part, budget_s, rehearse, shm_bytes)
    if rehearse:
        result = {**result, "rehearsal": "measured on the CPU by gpu-check --rehearse: not a "
                                         "reference result"}
    path = save_reference(ref, result, machine=result.get("machine") or describe_machine(),
                          directory=out_dir)
    failures = _section_failures(result)
    log(f"[gpu-check] {part} targets:\n" + format_targets(result.get("targets") or {}))
    for failure in failures:
        log(f"[gpu-check] {part}: FAILED {failure}")
    log(f"[gpu-check] {part}: {'FAILED' if failures else 'done'} -> {path}")
    return 2 if failures else 0


def run_compile_probe(*, rehearse: bool, log: Callable[[str], None] = print,
                      probe: Callable[..., dict] = compile_probe) -> int:
    """The torch.compile probe's step: 0 when it compiled and matched eager, or skipped because
    the toolchain is missing (the reason logged); 1 when the compile raised or the results differ."""
    device = "cpu" if rehearse else "cuda"
    if not rehearse and not cuda_available():
        raise GpuCheckRefused(_refusal())
    try:
        result = probe(device)
    except Exception as exc:  # BackendCompilerFailed, a Triton error: its own words
        log(f"[compile] FAILED: torch.compile on {device}: {type(exc).__name__}: "
            f"{(str(exc).strip().splitlines() or [''])[0][:300]}")
        return 1
    if result["skipped"]:
        log(f"[compile] skipped: {result['skipped']}")
        return 0
    same = result["max_abs_diff"] <= 1e-4
    log(f"[compile] torch.compile on {device}: first call (compiling) {result['first_call_s']:.1f} s, "
        f"second {result['second_call_s'] * 1e3:.1f} ms; compiled vs eager: max difference "
        f"{result['max_abs_diff']:.1e}" + ("" if same else " - FAILED: they differ"))
    return 0 if same else 1


def run_notebook_step(path: str | os.PathLike, log: Callable[[str], None] = print) -> int:
    """Run a notebook's code cells here (quick mode), every cell even after one failed; 0 when
    all passed, 1 otherwise, each failed cell named on a line of its own at the end."""
    result = run_notebook_cells(path, keep_going=True)
    name = Path(path).name
    for failure in result["failures"]:
        log(f"[notebook] {name}: FAILED cell {failure['cell']} ({failure['source']!r}): "
            f"{failure['error']}")
    log(f"[notebook] {name}: {result['status']}: {result['ran']} of {result['code_cells']} code "
        f"cells ran without error in {result['seconds']:.0f} s")
    return 0 if result["status"] == "passed" else 1


# ---- the summary ------------------------------------------------------------------------------

def format_targets(targets: Mapping) -> str:
    """The issue targets as lines for a person: measured value, threshold, met or not."""
    if not targets:
        return "  no targets were measured"
    lines = []
    for name, t in targets.items():
        if not isinstance(t, Mapping):
            lines.append(f"  {name}: {t}")
            continue
        met = t.get("met")
        mark = "MET    " if met else ("NOT MET" if met is not None else "n/a    ")
        measured = t.get("value", t.get("measured"))
        value = f"{measured:.3g}" if isinstance(measured, (int, float)) else str(measured)
        lines.append(f"  [{mark}] {name}: measured {value} (target {t.get('target')}) - "
                     f"{t.get('description', '')} {t.get('detail', '')}".rstrip())
    return "\n".join(lines)


def _targets(docs: Mapping[str, dict | None], results: Sequence[StepResult]) -> dict:
    """Every target measured, then every expected one that was not (``met: None``, with why)."""
    targets: dict[str, Any] = {}
    for doc in docs.values():
        if doc is not None and isinstance(doc["results"].get("targets"), Mapping):
            targets.update(doc["results"]["targets"])
    for part, names in EXPECTED_TARGETS.items():
        step = next((r for r in results if r.name.startswith(f"{part} ")), None)
        why = f"{part}: {step.status if step else 'not run'}"
        for name in names:
            targets.setdefault(name, {"description": "not measured", "value": None, "target": None,
                                      "met": None, "detail": f"(not measured: {why})"})
    return targets


def summarize(out_dir: str | os.PathLike, results: Sequence[StepResult], memory: Mapping, *,
              rehearse: bool, notes: Sequence[str] = (), preflight: Mapping | None = None) -> dict:
    """The summary of a run, written as ``gpu_check_summary.json`` into ``out_dir``: the
    preflight, every step, every failure, the targets (from the parts' files) and whether all
    were met."""
    docs = {part: load_reference(ref, directory=out_dir)
            for part, ref in (("lesson04", LESSON04), ("lesson05", LESSON05))}
    failures = [f"{r.name}: {line}" for r in results if not r.ok for line in r.failures[-3:]]
    targets = _targets(docs, results)
    summary = {"preflight": dict(preflight or {}), "steps": [r.to_dict() for r in results],
               "memory": dict(memory),
               "notes": list(notes), "failures": failures, "targets": targets,
               "total_s": sum(r.seconds for r in results),
               "all_targets_met": not failures and all(
                   isinstance(t, Mapping) and t.get("met") is True for t in targets.values())}
    if rehearse:
        summary["rehearsal"] = "gpu-check --rehearse on the CPU: not a reference result"
    machine = next((d["machine"] for d in docs.values() if d is not None), None)
    save_reference(SUMMARY, summary, machine=machine or describe_machine(), directory=out_dir)
    return summary


def _files_lines(out: Path, rehearse: bool) -> list[str]:
    files = sorted(p for p in out.iterdir() if p.is_file()) if out.is_dir() else []
    lines = [f"files in {out} ({len(files)}; {TAKES}): "
             + ", ".join(f"{p.name} ({p.stat().st_size / 1e3:.0f} kB)" for p in files)]
    refs = [f"{out}/{n}.json" for n in REFERENCE_NAMES if (out / f"{n}.json").is_file()]
    if rehearse:
        lines.append("a rehearsal: these files are not reference results; copy none of them")
    elif refs:
        lines.append(f"the reference results, and only these, go into course_utils/reference_results/: "
                     f"cp {' '.join(refs)} course_utils/reference_results/")
    return lines


def run_check(out_dir: str | os.PathLike, *, rehearse: bool = False, python: str = sys.executable,
              log_path: str | os.PathLike | None = None,
              steps: Callable[..., list[Step]] = check_steps) -> int:
    """The whole check (module docstring); 0 when every required step passed, else 1."""
    out = Path(out_dir)
    if not rehearse and not cuda_available():
        raise GpuCheckRefused(_refusal())
    if out.resolve() == REFERENCE_DIR.resolve():
        raise ValueError(f"--out {out}: give a folder of its own; copy the reference files into "
                         f"{REFERENCE_DIR} afterwards (the summary says which).")
    out.mkdir(parents=True, exist_ok=True)
    echo, close = echo_to(log_path if log_path is not None else out / OWN_FILES[0])
    try:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        memory, shm_lines = plan_shm(host_memory(), rehearse=rehearse, is_root=is_root,
                                     remount=_remount)
        pf = preflight(memory, cuda=cuda_available())
        echo(f"== preflight: {preflight_line(pf)}\n"
             + "".join(f"== {w}\n" for w in preflight_warnings(pf, rehearse=rehearse)))
        notes, _ = memory_notes(memory)
        notes += shm_lines
        optional = optional_library_notes()
        echo(f"== gpu-check{' --rehearse (every step, on the CPU)' if rehearse else ''}; "
             f"python {python}; out {out}\n" + "".join(f"== memory: {n}\n" for n in notes)
             + "".join(f"== optional: {n}\n" for n in optional))
        notes += optional
        todo = steps(out, python=python, rehearse=rehearse,
                     shm_free_bytes=memory.get("shm_free_bytes"))
        results = run_steps(todo, echo)
        try:
            summary = summarize(out, results, memory, rehearse=rehearse, notes=notes, preflight=pf)
            extra = [f"preflight: {preflight_line(pf)}", "targets:", format_targets(summary["targets"]),
                     f"all targets met: {summary['all_targets_met']}"]
        except Exception as exc:   # the summary must still be printed
            extra = [f"the summary file could not be written: {type(exc).__name__}: {exc}"]
            results.append(StepResult("summary", "failed", 0.0, IN_PROCESS_S, failures=extra[:1]))
        title = ("REHEARSAL on the CPU" if rehearse else "GPU check") + f", worst case " \
                f"{worst_case_s(todo, in_process_worst_s()):.0f} s"
        echo("\n" + summary_block(results, title=title, extra=extra + _files_lines(out, rehearse)))
        return 0 if all(r.ok for r in results) else 1
    finally:
        close()


# ---- command line -----------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add gpu-check's options to ``parser``."""
    parser.add_argument("--out", metavar="DIR", default="gpu_out",
                        help="write every file here (default: gpu_out); the summary says which "
                             "reference files to copy into course_utils/reference_results/")
    parser.add_argument("--rehearse", action="store_true",
                        help="run every step on the CPU (no GPU needed): the files are marked as "
                             "a rehearsal and are never reference results")
    parser.add_argument("--log", metavar="FILE", default=None,
                        help="the full log (default: DIR/gpu_check_log.txt)")
    parser.add_argument("--plan", action="store_true",
                        help="print the steps and their timeouts; run and write nothing")
    parser.add_argument("--part", choices=sorted(PARTS), default=None,
                        help="(a step) run one benchmark part and write its JSON into DIR")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="(with --part) its time budget")
    parser.add_argument("--shm-bytes", type=int, default=None, metavar="N",
                        help="(with --part) free bytes in /dev/shm: smaller loaders if short")
    parser.add_argument("--compile-probe", action="store_true",
                        help="(a step) torch.compile a tiny function on the device (the CPU with "
                             "--rehearse); skips, saying why, without a compiler or Python.h")
    parser.add_argument("--notebook", metavar="PATH", default=None,
                        help="(a step) run a notebook's code cells here, without Jupyter")
    return parser


def _plan_text(out: str, rehearse: bool) -> str:
    todo = check_steps(out, rehearse=rehearse, shm_free_bytes=host_memory().get("shm_free_bytes"))
    rows = [f"{s.timeout_s:5g} s (worst {step_worst_s(s):g})  {s.name}: "
            f"{' '.join(s.argv).replace(chr(10), '; ')[:100]}" for s in todo]
    return "\n".join(rows + [f"worst case {worst_case_s(todo, in_process_worst_s()):.0f} s (limit "
                             f"{LIMIT_S} s, {in_process_worst_s():g} s outside the steps)",
                             f"CUDA available here: {cuda_available()}"])


def cli(args: argparse.Namespace) -> int:
    """Run gpu-check from parsed arguments; 0 passed, 1 refused or a step failed, 2 a part's
    section failed (``--part``)."""
    try:
        if args.plan:
            print(_plan_text(args.out, args.rehearse))
            return 0
        if args.compile_probe:
            return run_compile_probe(rehearse=args.rehearse)
        if args.notebook is not None:
            if not Path(args.notebook).is_file():
                raise ValueError(f"--notebook {args.notebook}: no such notebook")
            return run_notebook_step(args.notebook)
        if args.part is not None:
            if args.budget is None or not args.budget > 0:
                raise ValueError(f"--part {args.part} needs --budget SECONDS (more than 0), e.g. "
                                 f"--budget {PARTS[args.part][1]}")
            return run_part(args.part, args.out, args.budget, rehearse=args.rehearse,
                            shm_bytes=args.shm_bytes)
        return run_check(args.out, rehearse=args.rehearse, log_path=args.log)
    except GpuCheckRefused as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(
        prog="python -m course_authoring gpu-check",
        description="The whole GPU check as independent steps, each with its own timeout (at most "
                    f"{LIMIT_S} s in all), ending with a summary; --rehearse runs it on the CPU."))
    return cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
