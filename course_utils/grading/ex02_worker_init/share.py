"""Step 1 of exercise 02: ``thread_share(cpu_budget, num_workers, forked)`` on cases at each rule's
edge: whole threads (integer division), never below 1, and 1 in a forked worker."""
from __future__ import annotations

from typing import Any, Callable

from ..checker import CheckResult, ExerciseFailed, call_answer, grader, require_signature

SHARE = "02.share"

#: (cpu_budget, num_workers, forked) -> threads per pool, each case next to the rule it tests
CASES = (
    ((8, 2, False), 4),      # an even split
    ((7, 2, False), 3),      # whole threads: 7 // 2, not 3.5
    ((3, 1, False), 3),      # one worker gets the whole budget
    ((2, 2, False), 1),      # exactly one each
    ((1, 2, False), 1),      # never below one thread (1 // 2 is 0)
    ((16, 4, True), 1),      # a forked worker: 1, whatever its share
    ((1, 1, True), 1),
)

def _rule(args: tuple[int, int, bool], want: int, got: Any) -> str:
    """Which rule a wrong answer broke, from the case it failed."""
    budget, workers, forked = args
    if forked:
        return ("a forked worker must keep 1 thread per pool whatever its share: growing a pool "
                "it inherited can hang it (lesson 02, section 5)")
    if budget < workers:
        return ("every worker needs at least one thread, even when the budget is smaller than "
                "the number of workers")
    if isinstance(got, float) or budget % workers:
        return ("a pool runs whole threads: the share is the budget divided by the workers, "
                "rounded down (integer division)")
    return f"{budget} CPUs shared by {workers} workers is {want} threads each"


@grader(SHARE)
def grade_share(answer: Callable[[int, int, bool], int]) -> CheckResult:
    """``answer(cpu_budget, num_workers, forked)`` on :data:`CASES`, each an exact int."""
    require_signature(SHARE, answer, "thread_share takes three arguments.",
                      "def thread_share(cpu_budget, num_workers, forked): ...", 1, 1, False)
    for args, want in CASES:
        call = f"thread_share({', '.join(map(repr, args))})"
        got = call_answer(SHARE, answer, *args, what=call)
        if type(got) is not int:                # bool is an int too, and not a thread count
            raise ExerciseFailed(SHARE, f"{call} returned {type(got).__name__} {got!r}, not an int.",
                                 expected=f"{want}", seen=repr(got),
                                 hint="a thread count is a whole number: use // rather than /, "
                                      "and return it (a function without return gives None).")
        if got != want:
            raise ExerciseFailed(SHARE, f"{call} returned {got}.", expected=str(want), seen=str(got),
                                 hint=_rule(args, want, got) + ".")
    return CheckResult(SHARE, f"the right share in all {len(CASES)} cases: whole threads, at least "
                              f"1, and 1 in a forked worker.")
