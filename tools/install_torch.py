"""Install torch and torchvision as a matched pair that loads, into the running interpreter.

Run by `make install` (and so by `make lab` and `make test`) with the venv's Python, before the
course package itself. torchvision is compiled against one torch release and one build of it: a
torchvision from one index next to a torch from another fails at import with
``RuntimeError: operator torchvision::nms does not exist``. So both come from one `pip install`,
from one index, and the result is checked by importing both and running a torchvision operator.

Steps, each only if the one before left a pair that does not load or does not meet ``--spec``:
  1. keep what is installed (a pair older than the spec, e.g. torch 2.2, is not kept);
  2. ``pip install torch torchvision`` (the pair pip picks for this platform, or from
     ``--index-url``);
  3. the same with ``--upgrade`` (a torch installed alone, e.g. from a local wheel, that no
     torchvision on the index matches, is replaced by the newest matched pair);
  4. stop with a message that says what to do.

    python tools/install_torch.py [--index-url URL] [--spec "torch>=2.5 torchvision>=0.20"]
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a fresh venv has pip, which carries its own copy
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

# The oldest pair the suite passes with. Older ones fail: torch 2.2 was built against NumPy 1
# (opencv-python 5 brings NumPy 2, and then torch.from_numpy fails), and torchvision 0.19's
# decode_jpeg takes no list of images (lesson 05's batched decode).
DEFAULT_SPEC = "torch>=2.5 torchvision>=0.20"

# Imports both and runs one compiled torchvision operator: the check that fails on a mismatch.
PROBE = (
    "import torch, torchvision\n"
    "from torchvision.ops import nms\n"
    "boxes = torch.tensor([[0., 0., 1., 1.], [0., 0., 1., 1.]])\n"
    "nms(boxes, torch.tensor([1., 0.5]), 0.5)\n"
    "print(f'torch {torch.__version__} + torchvision {torchvision.__version__}')\n"
)


def probe() -> tuple[bool, str]:
    """Return (loads, what it printed or the last line of its error)."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    if done.returncode == 0:
        return True, done.stdout.strip()
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return False, lines[-1] if lines else f"exit code {done.returncode}"


def unmet(spec: list[Requirement]) -> list[str]:
    """The requirements of ``spec`` that the installed packages do not meet, as sentences."""
    missing = []
    for req in spec:
        try:
            have = version(req.name)
        except PackageNotFoundError:
            missing.append(f"{req.name} is not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            missing.append(f"{req.name} {have} does not meet {req}")
    return missing


def pip_install(spec: list[str], index_url: str | None, upgrade: bool) -> None:
    command = [sys.executable, "-m", "pip", "install"]
    command += ["--upgrade"] if upgrade else []
    command += ["--index-url", index_url] if index_url else []
    command += spec
    print("+", shlex.join(command), flush=True)
    subprocess.run(command, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Install torch and torchvision as a matched pair that loads (see the module docstring).")
    parser.add_argument("--index-url", default="",
                        help="take both from this index, e.g. https://download.pytorch.org/whl/cpu "
                             "(default: pip's own index settings)")
    parser.add_argument("--spec", default=DEFAULT_SPEC,
                        help=f"the requirements to install, space-separated (default: {DEFAULT_SPEC!r})")
    args = parser.parse_args(argv)
    spec = args.spec.split()
    if not spec:
        parser.error("--spec is empty: give the requirements, e.g. --spec 'torch torchvision'")
    wanted = []
    for text in spec:
        try:
            wanted.append(Requirement(text))
        except InvalidRequirement:
            parser.error(f"--spec: {text!r} is not a pip requirement; write them like "
                         f"--spec '{DEFAULT_SPEC}'")
    index_url = args.index_url or None

    ok, said = probe()
    old = unmet(wanted) if ok else []
    if ok and not old:
        print(f"{said} already installed and loading together; kept.")
        return 0
    why = f"{said}, but {'; '.join(old)}" if ok else f"torch + torchvision do not load yet ({said})"
    print(f"{why}; installing a matched pair.", flush=True)
    for upgrade in (False, True):
        pip_install(spec, index_url, upgrade)
        ok, said = probe()
        if ok:
            print(f"{said}: they load together.")
            return 0
        print(f"after that install: {said}", flush=True)
    print(
        "error: torch and torchvision still do not load together. They must come from the same "
        "index: delete .venv and run make again, or name one index for both, e.g. "
        "make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
