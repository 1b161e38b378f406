"""Grader 04.prefetcher: the reference passes; plausible wrong answers fail, teaching why.

On a CPU-only machine the grader cannot see overlap or a missing wait_stream (both need CUDA
streams); those answers pass here with the limit stated, and fail on a GPU.
"""
from __future__ import annotations

import pytest
import torch

from course_utils.device import move_to_device
from course_utils.grading import ex04_prefetcher as G
from course_utils.grading.checker import CheckResult, ExerciseFailed, check, exercise_ids
from course_utils.prefetch import DevicePrefetcher
from _helpers import teaches

pytestmark = pytest.mark.timeout(120)
CUDA = torch.cuda.is_available()


def test_registered():
    assert "04.prefetcher" in exercise_ids()


class Reference:
    """The solution notebook's answer."""

    def __init__(self, loader, device):
        self.loader = loader
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def __len__(self):
        return len(self.loader)

    def copy(self, batch, stream):
        images, labels = batch
        if stream is None:
            return images.to(self.device), labels.to(self.device)
        with torch.cuda.stream(stream):
            return (images.to(self.device, non_blocking=True),
                    labels.to(self.device, non_blocking=True))

    def __iter__(self):
        stream = torch.cuda.Stream(self.device) if self.cuda else None
        it = iter(self.loader)
        end = object()
        nxt = next(it, end)
        if nxt is not end:
            nxt = self.copy(nxt, stream)
        while nxt is not end:
            if stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(stream)
                for tensor in nxt:
                    tensor.record_stream(current)
            batch = nxt
            nxt = next(it, end)
            if nxt is not end:
                nxt = self.copy(nxt, stream)
            yield batch


def test_reference_passes_and_says_what_it_could_not_check():
    result = check("04.prefetcher", Reference)
    assert isinstance(result, CheckResult)
    assert "double buffering" in result.summary
    if not CUDA:
        assert "NOT checked on this device" in result.summary
        assert "overlap" in result.summary and "wait_stream" in result.summary
        assert any("'meta'" in c for c in result.details["checked"])


class Base:
    def __init__(self, loader, device):
        self.loader, self.device = loader, torch.device(device)


class NoSecondBuffer(Base):
    """Synchronous copy of each batch right before it is used."""

    def __iter__(self):
        for images, labels in self.loader:
            yield images.to(self.device), labels.to(self.device)


class SkipsFirst(Base):
    def __iter__(self):
        it = iter(self.loader)
        nxt = next(it, None)
        for batch in it:
            nxt = move_to_device(batch, self.device)
            yield nxt


class SkipsLast(Base):
    def __iter__(self):
        it = iter(self.loader)
        end = object()
        current = next(it, end)
        if current is end:
            return
        current = move_to_device(current, self.device)
        for batch in it:
            nxt = move_to_device(batch, self.device)
            yield current
            current = nxt            # forgets to yield the last one after the loop


class YieldsTheNewOne(Base):
    """Yields batch k+1 (just copied) instead of batch k."""

    def __iter__(self):
        it = iter(self.loader)
        end = object()
        current = next(it, end)
        while current is not end:
            nxt = next(it, end)
            if nxt is not end:
                yield move_to_device(nxt, self.device)
            yield move_to_device(current, self.device)
            current = next(it, end) if nxt is not end else end


class LabelsOnly(Base):
    def __iter__(self):
        it = iter(self.loader)
        end = object()
        nxt = next(it, end)
        while nxt is not end:
            images, labels = nxt
            current = (images, labels.to(self.device, non_blocking=True))
            nxt = next(it, end)
            yield current


class ConvertsToFloat(Reference):
    def __iter__(self):
        for images, labels in super().__iter__():
            yield images.float() / 255, labels


class WholeEpochUpFront(Base):
    def __iter__(self):
        yield from [move_to_device(b, self.device) for b in self.loader]


class IteratorMadeInInit(Base):
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.it = iter(Reference(loader, device))

    def __iter__(self):
        return self.it


class ImagesOnly(Reference):
    def __iter__(self):
        for images, _ in super().__iter__():
            yield images


class NoWaitStream(Base):
    """The reference without wait_stream / record_stream: a race on CUDA, invisible on CPU."""

    def __iter__(self):
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        it = iter(self.loader)
        end = object()

        def preload():
            batch = next(it, end)
            if batch is end:
                return end
            if stream is None:
                return move_to_device(batch, self.device)
            with torch.cuda.stream(stream):
                return move_to_device(batch, self.device)

        nxt = preload()
        while nxt is not end:
            batch = nxt
            nxt = preload()
            yield batch


@pytest.mark.parametrize("answer, message", [
    (NoSecondBuffer, "no second buffer"),
    (SkipsFirst, "the first batch is missing"),
    (SkipsLast, "the last batch is missing"),
    (YieldsTheNewOne, "wrong order"),
    (LabelsOnly, "images of batch 0 stayed on cpu"),
    (ConvertsToFloat, "changed dtype"),
    (WholeEpochUpFront, "read the whole epoch"),
    (IteratorMadeInInit, "second pass"),
    (ImagesOnly, "single tensor"),
])
def test_wrong_answers_fail_with_a_lesson(answer, message):
    with pytest.raises(ExerciseFailed, match=message) as info:
        check("04.prefetcher", answer)
    assert teaches(info.value).exercise == "04.prefetcher"


def _batches_in_order(order, batch_size=3):
    """The batches a prefetcher handed out, as loader batch numbers (labels k*3 .. k*3+2)."""
    return [(torch.zeros(batch_size, 1), torch.arange(k * batch_size, (k + 1) * batch_size))
            for k in order]


@pytest.mark.parametrize("order, problem", [
    ([1, 2, 3], "the first batch is missing."), ([0, 1, 2], "the last batch is missing."),
    ([1, 0, 2, 3], "the batches came out in the wrong order."),
    ([0, 1, 1, 2], "some batches came out more than once."),
    ([0, 1, 2, 3, 3], "some batches came out more than once."),
    ([0, 2, 3], "some batches are missing."),
    ([0, 1, 2, 5], "some batches are missing.")])          # as many as the loader's, none twice
def test_each_kind_of_wrong_order_is_named_with_the_batches_seen(order, problem):
    # 4 batches of 3: a batch's number is its first label // 3 (not the label, not a float)
    loader = G._RecordingLoader(4, batch_size=3)
    with pytest.raises(ExerciseFailed) as info:
        G._check_order(_batches_in_order(order), loader, torch.device("cpu"))
    assert info.value.problem == problem
    assert (info.value.expected, info.value.seen) == ("batches [0, 1, 2, 3]", f"batches {order}")
    G._check_order(_batches_in_order([0, 1, 2, 3]), loader, torch.device("cpu"))    # right: passes


def test_on_the_meta_device_only_the_count_is_checked():
    loader = G._RecordingLoader(4, batch_size=3)
    with pytest.raises(ExerciseFailed) as info:
        G._check_order(_batches_in_order([0, 1, 2]), loader, torch.device("meta"))
    assert teaches(info.value).problem == "the prefetcher yielded 3 batches for a loader of 4."
    assert (info.value.expected, info.value.seen) == ("4 batches", "3")


def test_an_instance_or_a_wrong_signature_is_explained():
    instance = Reference([], "cpu")
    with pytest.raises(ExerciseFailed, match="not the class") as info:
        check("04.prefetcher", instance)
    teaches(info.value, instance)

    class OneArg:
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            return iter(self.loader)

    with pytest.raises(ExerciseFailed, match=r"calling Prefetcher\(loader, device\) failed") as info:
        check("04.prefetcher", OneArg)
    assert info.value.hint and info.value.exercise == "04.prefetcher"   # the error is the seen


def test_a_stub_is_not_done_yet():
    class Stub(Base):
        def __iter__(self):
            raise NotImplementedError("Exercise: replace this line with your code")

    with pytest.raises(ExerciseFailed, match="not done yet"):
        check("04.prefetcher", Stub)


@pytest.mark.skipif(CUDA, reason="on CUDA the race is detected instead")
def test_missing_wait_stream_cannot_be_seen_on_cpu_and_the_grader_says_so():
    result = check("04.prefetcher", NoWaitStream)
    assert "NOT checked on this device" in result.summary and "wait_stream" in result.summary


@pytest.mark.skipif(not CUDA, reason="needs CUDA streams")
def test_on_cuda_a_missing_wait_stream_races_and_a_synchronous_copy_does_not_overlap():
    with pytest.raises(ExerciseFailed, match="race"):
        check("04.prefetcher", NoWaitStream)

    class LookaheadButSynchronous(Base):
        def __iter__(self):
            it = iter(self.loader)
            end = object()
            nxt = next(it, end)
            nxt = end if nxt is end else move_to_device(nxt, self.device, non_blocking=False)
            while nxt is not end:
                batch = nxt
                nxt = next(it, end)
                if nxt is not end:
                    nxt = move_to_device(nxt, self.device, non_blocking=False)
                yield batch

    with pytest.raises(ExerciseFailed, match="did not overlap"):
        check("04.prefetcher", LookaheadButSynchronous)


# ---- the race check: every pass and batch holds its own values ---------------------------------


class ReplaysItsFirstCopies(Base):
    """Hands out what it copied the first time it saw each batch: what a cached block that
    still holds an earlier pass's batch looks like to the consumer."""

    copies: dict = {}

    def __iter__(self):
        for k, (images, labels) in enumerate(self.loader):
            cached = self.copies.setdefault(k, (images.to(self.device).clone(), labels.clone()))
            yield cached


def test_race_fills_differ_for_every_pass_and_batch():
    values = [G._race_fill(p, k) for p in range(len(G._RACE_PASSES)) for k in range(G._RACE_BATCHES)]
    assert len(set(values)) == len(values) and all(1 <= v <= 250 for v in values)


def test_race_check_logic_on_cpu_catches_stale_batches():
    cpu = torch.device("cpu")
    assert G._cuda_race_check(Reference, cpu, 1)["race_reads"] == 5 * 8
    ReplaysItsFirstCopies.copies = {}
    with pytest.raises(ExerciseFailed, match="a race") as info:
        G._cuda_race_check(ReplaysItsFirstCopies, cpu, 1)
    assert "32 wrong reads over 5 passes" in info.value.seen       # all but the first pass


class NoRecordStream(Base):
    """The reference with wait_stream but without record_stream: a batch's memory can be given
    to a later copy while the current stream has still to read it."""

    def __iter__(self):
        stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        end = object()

        def preload():
            batch = next(it, end)
            if batch is end:
                return end
            with torch.cuda.stream(stream):
                return move_to_device(batch, self.device)

        nxt = preload()
        while nxt is not end:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            batch = nxt
            nxt = preload()
            yield batch


@pytest.mark.skipif(not CUDA, reason="needs CUDA streams")
def test_on_cuda_a_missing_record_stream_is_caught_and_the_reference_passes():
    assert G._cuda_race_check(Reference, torch.device("cuda"), 32)["race_busy_passes"] == 2
    with pytest.raises(ExerciseFailed, match="race") as info:
        G._cuda_race_check(NoRecordStream, torch.device("cuda"), 32)
    assert "record_stream" in info.value.hint


# ---- the course's own prefetcher is refused ---------------------------------------------------


@pytest.mark.parametrize("exercise", ["04.copy", "04.prefetcher"])
@pytest.mark.parametrize("answer", [DevicePrefetcher, DevicePrefetcher([], "cpu")])
def test_the_course_prefetcher_is_refused_with_a_teaching_message(exercise, answer):
    with pytest.raises(ExerciseFailed) as info:
        check(exercise, answer)
    err = info.value
    assert "course's own `DevicePrefetcher` (course_utils.prefetch)" in err.problem, str(err)
    assert "write this mechanism yourself" in err.hint


class UsesMoveToDevice(Reference):
    """The reference, its copy written with the course's ``move_to_device`` (allowed)."""

    def copy(self, batch, stream):
        if stream is None:
            return move_to_device(batch, self.device)
        with torch.cuda.stream(stream):
            return move_to_device(batch, self.device, non_blocking=True)


def test_an_answer_calling_a_course_helper_is_judged_by_what_it_does():
    # a right answer that uses the allowed helper passes on every device (NoWaitStream, which
    # also uses it, races on CUDA: it cannot stand for "allowed" there)
    assert "PASSED" in str(check("04.prefetcher", UsesMoveToDevice))


def test_hints_name_the_tools_without_printing_the_solution_lines():
    ReplaysItsFirstCopies.copies = {}
    with pytest.raises(ExerciseFailed) as info:
        G._cuda_race_check(ReplaysItsFirstCopies, torch.device("cpu"), 1)
    hint = info.value.hint
    assert "wait_stream" in hint and "record_stream" in hint
    assert "current_stream().wait_stream(stream)" not in hint
    assert "record_stream(torch.cuda.current_stream())" not in hint
    for answer in (SkipsFirst, NoSecondBuffer):
        with pytest.raises(ExerciseFailed) as info:
            check("04.prefetcher", answer)
        assert "copy batch 0, then in the loop" not in info.value.hint
        assert "before the loop, copy batch 0" not in info.value.hint


# ---- what the prefetcher's iteration can get wrong, one failure each -----------------------------

class NotAnIterator(Reference):
    def __iter__(self):
        return [1, 2]                                          # iter() refuses a list


class RaisesInTheLoop(Reference):
    def __iter__(self):
        yield from ()
        raise KeyError("cuda stream missing")


class NeverStops(Reference):
    def __iter__(self):
        batch = next(iter(self.loader))
        while True:
            yield batch


class YieldsDicts(Reference):
    def __iter__(self):
        for images, labels in super().__iter__():
            yield {"images": images, "labels": labels}


class YieldsNone(Reference):
    def __iter__(self):
        yield None


class YieldsTriples(Reference):
    def __iter__(self):
        for images, labels in super().__iter__():
            yield images, labels, labels


class ReshapesLabels(Reference):
    def __iter__(self):
        for images, labels in super().__iter__():
            yield images, labels.view(1, -1)


@pytest.mark.parametrize("answer, problem, hint", [
    (YieldsNone, "batch 0", "yield the moved batch itself"),          # None is a batch, not the end
    (YieldsTriples, "batch 0", "yield the moved batch itself"),
    (ReshapesLabels, "batch 0 changed shape.", "move the tensors as they are."),
    (NotAnIterator, "iter(prefetcher) raised TypeError", "__iter__ should return an iterator"),
    (RaisesInTheLoop, "iterating raised KeyError",
     "CUDA calls (streams, record_stream) only on a CUDA device"),
    (NeverStops, "the prefetcher yields more batches than the loader has.", "stop when the loader is exhausted"),
    (YieldsDicts, "batch 0", "yield the moved batch itself")], ids=lambda v: getattr(v, "__name__", ""))
def test_each_way_an_iteration_goes_wrong_is_named_with_its_hint(answer, problem, hint):
    with pytest.raises(ExerciseFailed) as info:
        check("04.prefetcher", answer)
    err = info.value
    assert problem in err.problem and hint in err.hint, str(err)
    assert err.exercise == "04.prefetcher"
    if answer is ReshapesLabels:
        assert teaches(err).seen == "images (4, 3, 8, 8), labels (1, 4)", err.seen


def test_the_iteration_hint_follows_the_error_and_the_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert "leave pinning to the DataLoader" in G._iteration_hint(RuntimeError("cannot pin memory"), cpu)
    assert "only on a CUDA device" in G._iteration_hint(RuntimeError("CUDA error"), cpu)
    assert "read the traceback" in G._iteration_hint(RuntimeError("CUDA error"), cuda)
    assert "read the traceback" in G._iteration_hint(RuntimeError("pin failed"), cuda)


def test_a_number_is_not_a_prefetcher_class():
    with pytest.raises(ExerciseFailed) as info:
        check("04.prefetcher", 5)
    teaches(info.value, 5)
    assert info.value.expected == 'check("04.prefetcher", Prefetcher)'
