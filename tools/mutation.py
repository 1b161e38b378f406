#!/usr/bin/env python3
"""``make mutation``: how many small bugs put into the code that computes figures and verdicts
do the tests catch? Runs mutmut (3.x) group by group: each group is a few modules and every test
file that imports one of them (tools/mutation_groups.py), run in a scratch copy of this checkout
(``build/mutation/``), so the working tree is never mutated. Prints, per group, the mutants killed / survived / timed
out and the score, and for the survivors which function they are in, and how many change only
the text of a message (a string literal): those are left to the wording tests, the rest are the
ones to kill. The report is also written to ``build/mutation/report.md``. ``--rerun`` runs again
only what a group's last run missed (an "after" score); ``--hand`` puts in a fixed list of
hand-made bugs (:data:`HAND_MUTATIONS`) one at a time and names the tests that catch each.

Why mutmut: it runs the test suite once, then forks that warm process for each mutant and runs
only the tests that reach the mutated function (about 5 mutants per second here), where
cosmic-ray starts the whole test command, torch's import included, for every mutant. Not part of
``make test`` (it takes minutes per group on 2 CPUs).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tokenize
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_groups import GROUPS, VERDICTS_DIR, VERDICTS_PACKAGE, tests_for, write_verdict_modules  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"

#: Where a module of :data:`GROUPS` lived before the three-layer layout, so that ``--rev`` can
#: score a commit from before it with the same group.
OLD_PATHS = {
    "course_utils/timing.py": "course_utils/bench.py",
    "course_utils/lessons/l03_num_workers.py": "course_utils/lessons/l03_memory.py",
    "course_utils/grading/ex00_measure_first.py": "course_utils/graders/ex00_timing.py",
    "course_utils/grading/ex03_num_workers.py": "course_utils/graders/ex03_scaling.py",
}
#: the survivors judged equivalent or harmless, one line each: ``- `mutant name` (function): why``
SURVIVORS = Path(__file__).resolve().parent / "mutation_survivors.md"
MUTANT_RE = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+)$")
#: mutmut stops a mutant's tests after (their baseline time + 1 s) x this in CPU seconds, and after
#: half that in wall time: mutmut's default (15) let a mutant that deadlocks a worker wait minutes
TIMEOUT_MULTIPLIER = 5.0


@dataclass(frozen=True)
class HandMutation:
    """One bug put in on purpose by hand (``--hand``): in ``path``, each ``(old, new)`` of
    ``edits`` replaces text found exactly once; one of ``tests`` (pytest files or node ids)
    must then fail."""

    what: str
    path: str
    edits: tuple[tuple[str, str], ...]
    tests: tuple[str, ...]


#: The 13 small bugs issue 22 put into the package, each of which a test must catch.
HAND_MUTATIONS: tuple[HandMutation, ...] = (
    HandMutation("median -> mean", "course_utils/measurement.py",
                 (("float(np.median(self.times_s))", "float(np.mean(self.times_s))"),), ("tests/test_timing.py",)),
    HandMutation("warm-up one batch short", "course_utils/timing.py",
                 (("for _ in zip(range(warmup), pull):", "for _ in zip(range(warmup - 1), pull):"),), ("tests/test_timing.py",)),
    HandMutation("CPU per sample over the first repeat's count, not the sum", "course_utils/timing.py",
                 (("sum(counts), windows, monitor", "counts[0], windows, monitor"),), ("tests/test_timing.py",)),
    HandMutation("threadpool_limits(n + 1)", "course_utils/threads.py",
                 (("threadpoolctl.threadpool_limits(limits=n))",
                   "threadpoolctl.threadpool_limits(limits=n + 1))"),), ("tests/test_threads.py",)),
    HandMutation("NumPy seed ignores worker_id", "course_utils/threads.py",
                 (("np.random.seed((self.seed + worker_id) % 2**32)", "np.random.seed(self.seed % 2**32)"),),
                 ("tests/test_threads.py",)),
    HandMutation("RecordArrayDataset reads its paths from a Python list",
                 "course_utils/lessons/l03_num_workers.py",
                 (("        encoded = [", "        self.paths = [r['path'] for r in records]\n        encoded = ["),
                  ('path = self.path_bytes[start:end].tobytes().decode("utf-8")', "path = self.paths[i]")),
                 ("tests/test_grader03.py",)),
    HandMutation("grader 00's upper tolerance 1.6 -> 16", "course_utils/grading/ex00_measure_first.py",
                 (("HIGH_TOLERANCE = 1.6", "HIGH_TOLERANCE = 16"),), ("tests/test_grader00.py",)),
    HandMutation("grader 00's seconds-per-batch unit check removed",
                 "course_utils/grading/ex00_measure_first.py",
                 (('("seconds per batch", batch_size / honest, inverted),', ""),), ("tests/test_grader00.py",)),
    HandMutation("choose_workers' window +1 -> +3", "course_utils/grading/ex03_num_workers.py",
                 (("STEPS_PAST_SATURATED = 1", "STEPS_PAST_SATURATED = 3"),), ("tests/test_grader03.py",)),
    HandMutation("ENOUGH_FRACTION 0.85 -> 0.6", "course_utils/grading/ex03_num_workers.py",
                 (("ENOUGH_FRACTION = 0.85", "ENOUGH_FRACTION = 0.6"),), ("tests/test_grader03.py",)),
    HandMutation("copy-on-read limit 0.15 -> 0.9", "course_utils/grading/ex03_num_workers.py",
                 (("GROWTH_FRACTION = 0.15", "GROWTH_FRACTION = 0.9"),), ("tests/test_grader03.py",)),
    HandMutation("DATA_BOUND_FRACTION 0.10 -> 0.50", "course_utils/tools/diagnose/rules.py",
                 (("DATA_BOUND_FRACTION = 0.10", "DATA_BOUND_FRACTION = 0.50"),), ("tests/test_diagnose.py",)),
    HandMutation("grade never passes", "course_utils/grading/grade.py",
                 (('ok = row["outcome"] == "passed"', "ok = False"),),
                 ("tests/test_notebooks.py::test_grade_passes_a_solved_notebook_and_fails_its_exercise",)),
)


def _checkout_files() -> list[str]:
    """The checkout's files as git sees them: tracked and untracked, not ignored ones."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [name for name in listed if name and (ROOT / name).is_file()]


def _copy_checkout(dest: Path, rev: str | None = None) -> None:
    """The checkout as git sees it (tracked and untracked files, not ignored ones) into dest;
    with ``rev``, that commit's files instead (to compare a score with an earlier one)."""
    if dest.exists():
        shutil.rmtree(dest)
    if rev is not None:
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return
    for name in _checkout_files():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


def _configure(dest: Path, modules: list[str], tests: list[str]) -> None:
    """Append this group's [tool.mutmut] table to the copy's pyproject.toml."""
    also = sorted({p.split("/")[0] for p in
                   subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout.split()} - {"course_utils"})
    table = ("\n[tool.mutmut]\n"
             f"source_paths = [\"course_utils/\"]\n"
             f"only_mutate = {json.dumps(modules)}\n"
             f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
             f"pytest_add_cli_args = [\"-p\", \"no:cacheprovider\", \"-q\", \"-x\"]\n"
             f"also_copy = {json.dumps(also)}\n"
             f"timeout_multiplier = {TIMEOUT_MULTIPLIER}\n")
    with open(dest / "pyproject.toml", "a", encoding="utf-8") as fh:
        fh.write(table)


def _mutmut(dest: Path, *args: str, log: Path | None = None, timeout: float | None = None) -> str:
    cmd = [sys.executable, "-m", "mutmut", *args]
    # one OpenMP thread: mutmut forks its warm process for each mutant, and a fork taken after
    # torch's OpenMP pool ran deadlocks in the child (every mutant would read "timeout", caught)
    env = dict(os.environ, COURSE_QUICK="1", MPLBACKEND="Agg", COURSE_NOTEBOOK_MODULES=VERDICTS_PACKAGE,
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if log is None:
        return subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True,
                              timeout=timeout).stdout
    with open(log, "w", encoding="utf-8") as fh:
        try:
            subprocess.run(cmd, cwd=dest, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:   # what was tested so far is still counted
            print(f"mutation: {dest.name}: stopped after {timeout:.0f} s (--timeout); partial counts",
                  flush=True)
    return ""


def _tokens(line: str) -> list[tuple[int, str]] | None:
    """The line's tokens as (type, text); a line cut out of a longer statement (an open bracket)
    keeps the tokens read before the tokenizer gave up; None when not even one could be read."""
    out: list[tuple[int, str]] = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
                out.append((t.type, t.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out or None


def _prose(literal: str) -> bool:
    """Whether a string literal reads as words (it holds a space, or ends a sentence: the last
    piece of a message split over lines, "subtract."): a message's text, not a key, a name or a
    flag ("pid", "fetch", "trace.json", "utf-8", "")."""
    body = re.sub(r"^[rbfuRBFU]*(\"\"\"|\'\'\'|\"|\')", "", literal)[:-1]
    return bool(re.search(r"\s", body) or re.search(r"[A-Za-z][.!?:]['\"]*$", body))


def text_only(diff: str) -> bool:
    """True when a mutant's diff changes nothing but the words of messages: every line differs
    only inside string literals, and each literal it changes reads as words (:func:`_prose`; a
    key or a name such as "pid" or "fetch" changed is code: it is not counted apart)."""
    minus = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if not minus or len(minus) != len(plus):
        return False
    for a, b in zip(minus, plus):
        ta, tb = _tokens(a), _tokens(b)
        if ta is None or tb is None or len(ta) != len(tb):
            return False
        for (kind, x), (_, y) in zip(ta, tb):
            if x != y and (kind != tokenize.STRING or not (_prose(x) or _prose(y))):
                return False
    return True


def _function_of(name: str) -> str:
    """course_utils.measurement.x_from_times__mutmut_3 -> measurement.from_times."""
    module, _, mangled = name.rpartition(".")
    func = re.sub(r"__mutmut_\d+$", "", mangled)
    func = re.sub(r"^x[ǁ_]", "", func).replace("ǁ", ".")
    return f"{module.rpartition('.')[2]}.{func}"


def modules_in(copy: Path, modules: list[str], where: str) -> list[str]:
    """``modules`` as ``copy`` has them: each path, or where it lived before the three-layer
    layout (:data:`OLD_PATHS`); a module in neither place stops the run with one line."""
    found = [m if (copy / m).is_file() else OLD_PATHS.get(m, m) for m in modules]
    missing = [m for m in found if not (copy / m).is_file()]
    if missing:
        raise SystemExit(f"mutation: {where}: no {', '.join(missing)} to mutate")
    return found


def run_group(group: str, timeout_s: float, rev: str | None = None, children: int = 2) -> dict:
    """Mutate one group in its own scratch copy; its counts and its survivors."""
    modules = GROUPS[group]
    dest = WORK / (group if rev is None else f"{group}@{rev}")
    _copy_checkout(dest, rev)
    if any(m.startswith(VERDICTS_DIR) for m in modules):
        write_verdict_modules(dest)                   # the notebooks' verdict cells, as files
    modules = modules_in(dest, modules, f"{group}@{rev or 'this checkout'}")
    tests = tests_for(modules, dest)                  # as that copy's tests import them
    _configure(dest, modules, tests)
    t0 = time.perf_counter()
    _mutmut(dest, "run", "--max-children", str(children), log=WORK / f"{dest.name}.log", timeout=timeout_s)
    if "Failed to run clean test" in (WORK / f"{dest.name}.log").read_text(errors="replace"):
        print(f"mutation: {group}: its tests fail in mutmut's copy before any mutant (see "
              f"{WORK / dest.name}.log): no mutant ran", flush=True)
    return _save(_collect(group, dest, modules, tests, t0), dest.name)      # GROUP or GROUP@REV


def _collect(group: str, dest: Path, modules: list[str], tests: list[str], t0: float) -> dict:
    """A finished run's counts and its not-caught mutants with their diffs."""
    _mutmut(dest, "export-cicd-stats")
    stats_file = dest / "mutants" / "mutmut-cicd-stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
    listed = [m for m in map(MUTANT_RE.match, _mutmut(dest, "results").splitlines())
              if m and m.group("status") in ("survived", "timeout", "no tests")]
    with ThreadPoolExecutor(4) as pool:          # `mutmut show` starts Python each time: ~1 s
        diffs = list(pool.map(lambda m: _mutmut(dest, "show", m.group("name")), listed))
    survivors = [{"name": m.group("name"), "status": m.group("status"),
                  "function": _function_of(m.group("name")), "diff": diff}
                 for m, diff in zip(listed, diffs)]
    return {"group": group, "modules": modules, "tests": tests, "stats": stats,
            "seconds": time.perf_counter() - t0, "survivors": survivors}


def _save(result: dict, name: str) -> dict:
    """Keep a group's result as ``build/mutation/NAME.json`` (what ``--rerun`` starts from)."""
    (WORK / f"{name}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def rerun_survivors(group: str, timeout_s: float, children: int = 2) -> dict:
    """The "after" score of a group without running every mutant again: in the group's scratch
    copy from its last run, bring every file but the mutated modules up to date with this
    checkout (new tests, fixed helpers), run only the mutants that were not caught then, and
    score all of them (those caught before stay caught: their code and the tests that caught
    them are unchanged, or the run says so). Stops with one line when the copy is missing or a
    mutated module changed since (then the mutants are stale: run the group in full)."""
    modules = GROUPS[group]
    dest = WORK / group
    previous = WORK / f"{group}.json"
    if not (dest / "mutants").is_dir() or not previous.is_file():
        raise SystemExit(f"mutation: --rerun {group}: no earlier run to start from; run "
                         f"tools/mutation.py {group} first")
    if any(m.startswith(VERDICTS_DIR) for m in modules):
        write_verdict_modules(WORK / "verdicts-now")       # to compare with the mutated copy
    for module in modules:
        now = WORK / "verdicts-now" / module if module.startswith(VERDICTS_DIR) else ROOT / module
        if (dest / module).read_bytes() != now.read_bytes():
            raise SystemExit(f"mutation: --rerun {group}: {module} changed since the last run; "
                             f"its mutants are stale: run tools/mutation.py {group}")
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    tests = tests_for(modules, ROOT)
    _configure(dest, modules, tests)                       # this checkout's test list
    for name in _checkout_files():
        if name in modules or name == "pyproject.toml":
            continue
        for base in (dest, dest / "mutants"):
            if (base / name.split("/")[0]).exists():
                (base / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, base / name)
    before = json.loads(previous.read_text())
    names = [x["name"] for x in before["survivors"] if x["status"] in ("survived", "no tests")]
    t0 = time.perf_counter()
    _mutmut(dest, "run", "--max-children", str(children), *names,
            log=WORK / f"{group}-rerun.log", timeout=timeout_s)
    result = _collect(group, dest, modules, tests, t0)
    result["stats"] = merged_stats(before["stats"], result["stats"])
    return _save(result, group)


def merged_stats(before: dict, rerun: dict) -> dict:
    """The counts after a --rerun. mutmut keeps the earlier results where it can (then the
    rerun's counts are already whole) and drops them when the test selection changed (then the
    mutants the earlier run caught show as not checked): those stay caught, as killed."""
    total = before.get("total", 0)
    outcomes = CAUGHT + MISSED + ("skipped", "suspicious")
    unchecked_then = total - sum(before.get(k, 0) for k in outcomes)
    unchecked_now = total - sum(rerun.get(k, 0) for k in outcomes)
    carried = min(sum(before.get(k, 0) for k in CAUGHT), max(0, unchecked_now - unchecked_then))
    out = {k: rerun.get(k, 0) for k in CAUGHT + MISSED + ("skipped", "suspicious")}
    out["killed"] += carried
    out["total"] = total
    return out


def run_hand(mutations: tuple[HandMutation, ...] = HAND_MUTATIONS) -> list[dict]:
    """Put each hand mutation into one scratch copy of this checkout, run its tests there (the
    copy first on PYTHONPATH, so workers and subprocesses import it too), then undo it. A
    mutation is caught when pytest reports a failed test (exit status 1); every failed test is
    listed. Any other exit status (an error before any test ran) is reported as such."""
    dest = WORK / "hand"
    _copy_checkout(dest)
    env = dict(os.environ, COURSE_QUICK="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(dest), os.environ.get("PYTHONPATH")])))
    results = []
    for m in mutations:
        target = dest / m.path
        original = target.read_text(encoding="utf-8")
        mutated = original
        for old, new in m.edits:
            if mutated.count(old) != 1:
                raise SystemExit(f"mutation: --hand: {m.what!r}: {old!r} is not in {m.path} exactly "
                                 f"once; update HAND_MUTATIONS in tools/mutation.py")
            mutated = mutated.replace(old, new)
        target.write_text(mutated, encoding="utf-8")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                                   *m.tests], cwd=dest, env=env, capture_output=True, text=True)
        finally:
            target.write_text(original, encoding="utf-8")
        failed = re.findall(r"^FAILED (.+?)(?: - .*)?$", proc.stdout, flags=re.MULTILINE)
        results.append({"what": m.what, "path": m.path, "status": proc.returncode,
                        "caught": proc.returncode == 1 and bool(failed), "by": failed,
                        "seconds": time.perf_counter() - t0, "tail": "" if failed else proc.stdout[-2000:]})
        print(f"mutation: hand: {m.what}: "
              + (f"caught by {len(failed)} test(s): {', '.join(failed)}" if results[-1]["caught"] else
                 f"NOT caught (pytest exit status {proc.returncode})"), flush=True)
    return results


def hand_report(results: list[dict]) -> str:
    """The hand mutations as a table: what was put in, where, and the test that caught it."""
    caught = sum(r["caught"] for r in results)
    lines = [f"# Hand mutations: {caught} of {len(results)} caught", "",
             "| mutation | module | failed tests | caught by (the first three) |", "|---|---|---:|---|"]
    for r in results:
        by = ("<br>".join(f"`{t}`" for t in r["by"][:3]) if r["caught"] else
              f"**not caught** (pytest exit status {r['status']})")
        lines.append(f"| {r['what']} | `{r['path']}` | {len(r['by'])} | {by} |")
    return "\n".join(lines) + "\n"


#: mutmut's outcomes that mean the tests caught the mutant (a timeout: they hung or ran away)
CAUGHT = ("killed", "timeout", "segfault")
#: outcomes that mean they did not: it passed, or no selected test reached the mutated function
MISSED = ("survived", "no_tests")


def score_line(group: str, modules: list[str], stats: dict, text_only: int) -> str:
    """One row of the score table. ``score`` = caught / (caught + missed) over the mutants that
    ran (a run stopped by --timeout leaves some unchecked: counted apart, never as missed);
    the last column leaves out the missed mutants that change only a message's text."""
    caught = sum(stats.get(k, 0) for k in CAUGHT)
    missed = sum(stats.get(k, 0) for k in MISSED)
    unchecked = stats.get("total", 0) - caught - missed - stats.get("skipped", 0) - stats.get("suspicious", 0)
    ran = caught + missed
    code_ran = ran - text_only
    return (f"| {group} | {', '.join(Path(m).name for m in modules)} | {stats.get('total', 0)} | "
            f"{unchecked} | {stats.get('killed', 0)} | {stats.get('timeout', 0)} | "
            f"{stats.get('survived', 0)} | {stats.get('no_tests', 0)} | "
            f"{caught / ran if ran else 0:.0%} | {caught / code_ran if code_ran else 0:.0%} |")


def explained(path: Path = SURVIVORS) -> dict[str, str]:
    """mutant name -> the reason :data:`SURVIVORS` gives for leaving it alive. A line may name
    several mutants of one function: the first in full, the others in full or by their number
    (`` `pkg.mod.x_f__mutmut_7`, `_8`, `_12` (f): reason``)."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    out: dict[str, str] = {}
    for names, reason in re.findall(r"^- ((?:`[^`]+`(?:,| /| and)? )+)(.+)$", text, flags=re.MULTILINE):
        first, *more = re.findall(r"`([^`]+)`", names)
        stem = re.sub(r"_\d+$", "", first)
        for name in (first, *more):
            out[stem + name if name.startswith("_") else name] = reason
    return out


def report(results: list[dict], reasons: dict[str, str] | None = None) -> str:
    """The groups' scores, and the missed mutants that change more than a message's text and
    that tools/mutation_survivors.md does not explain, by function."""
    reasons = explained() if reasons is None else reasons
    lines = ["# Mutation score (mutmut)", "",
             "| group | modules | mutants | not run | killed | timeout | survived | no tests | score "
             "| score without text-only |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:                                 # a saved run is judged by today's rule
        missed = [x for x in r["survivors"] if x["status"] in ("survived", "no tests")]
        lines.append(score_line(r["group"], r["modules"], r["stats"],
                                sum(text_only(x["diff"]) for x in missed)))
    for r in results:
        code = [x for x in r["survivors"] if x["status"] in ("survived", "no tests")
                and not text_only(x["diff"])]
        left = [x for x in code if x["name"] not in reasons]
        if not code:
            continue
        lines += ["", f"## {r['group']}: {len(code)} missed mutants that change code, "
                      f"{len(code) - len(left)} of them explained in {SURVIVORS.name}; the rest by function", ""]
        for (func, status), n in Counter((x["function"], x["status"]) for x in left).most_common():
            lines.append(f"- {func} ({status}): {n}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", default=list(GROUPS), metavar="GROUP",
                        help=f"groups to mutate (default: all of {', '.join(GROUPS)})")
    parser.add_argument("--timeout", type=float, default=1800, metavar="SECONDS",
                        help="stop a group's run after this long (default 1800)")
    parser.add_argument("--rev", default=None, metavar="COMMIT",
                        help="mutate that commit's files instead of the working tree (a 'before' score)")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 2, metavar="N",
                        help="mutants tested at once (default: the CPU count); a group whose "
                             "mutants often hang (diagnose) finishes sooner with more")
    parser.add_argument("--rerun", action="store_true",
                        help="instead of mutating afresh: run again only the mutants each group's "
                             "last run did not catch, against this checkout's tests (an 'after' score)")
    parser.add_argument("--hand", action="store_true",
                        help="instead: put in each of the hand mutations (HAND_MUTATIONS, the 13 "
                             "of issue 22) one at a time and say which test caught it")
    parser.add_argument("--report", action="store_true",
                        help="instead: print the report of each group's last run again (after "
                             "editing mutation_survivors.md), without running anything")
    parser.add_argument("--list", action="store_true",
                        help="print each group's modules and the test files that import them, and stop")
    args = parser.parse_args(argv)
    if args.list:
        for group, modules in GROUPS.items():
            print(f"{group}: {', '.join(modules)}\n    tests: {', '.join(tests_for(modules)) or 'NONE'}")
        return 0
    if args.hand:
        WORK.mkdir(parents=True, exist_ok=True)
        text = hand_report(run_hand())
        (WORK / "hand_report.md").write_text(text, encoding="utf-8")
        print(text)
        return 0 if "not caught" not in text else 1
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"GROUP {unknown[0]!r} is not one of {', '.join(GROUPS)}")
    if args.report:                                        # no mutmut needed: the saved runs
        saved = {g: WORK / f"{g}.json" for g in args.groups}
        for group in (g for g, path in saved.items() if not path.is_file()):
            print(f"mutation: {group}: no saved run in {WORK}", file=sys.stderr)
        print(report([json.loads(p.read_text()) for p in saved.values() if p.is_file()]))
        return 0
    try:
        import mutmut
        del mutmut                                         # installed by make mutation
    except ImportError:
        print("mutation: mutmut is not installed; run make mutation (it installs .[mutation])",
              file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    results = []
    for group in args.groups:
        print(f"mutation: {group} ({', '.join(GROUPS[group])}) ...", flush=True)
        results.append(rerun_survivors(group, args.timeout, args.children) if args.rerun else
                       run_group(group, args.timeout, args.rev, args.children))
        s = results[-1]["stats"]
        print(f"mutation: {group}: {s.get('killed', 0)} of {s.get('total', 0)} killed in "
              f"{results[-1]['seconds']:.0f} s", flush=True)
    text = report(results)
    suffix = "" if args.rev is None else f"@{args.rev}"
    (WORK / f"report{suffix}.md").write_text(text, encoding="utf-8")
    (WORK / f"survivors{suffix}.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(text)
    print(f"survivors with their diffs: {WORK / f'survivors{suffix}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
