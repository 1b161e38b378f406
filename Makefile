# Feed the GPU — two commands on a fresh machine:
#   make lab    install everything into .venv and open the course in JupyterLab
#   make test   install everything into .venv and run the whole test suite (quick mode)
#   make quick  only its first stage: the quick suite, without the lessons' double run
# Opt-in tools, not part of make test:
#   make browser-check   run lesson 00 in JupyterLab in headless Chromium (tools/browser_check.py)
#   make runtimes        time every lesson, quick and full mode, into README.md (tools/lesson_runtimes.py)
#   make mutation        mutation score of the code that computes figures and verdicts (tools/mutation.py)
#   make suite-cpu       where the quick suite's CPU time goes, per area, file and test (tools/suite_cpu.py)
#   make core-paths      run every lesson with its deep dives skipped (a few minutes)
#   make site            the course as a website from the notebooks executed here (build/site; FULL=1: full mode)
#   make site-check      open every page of build/site in headless Chromium (tools/site_check.py)
#
# Knobs (make VAR=value ...):
#   PYTHON           interpreter that creates the venv (default: python3, needs >= 3.10)
#   TORCH_SPEC       the torch + torchvision pair to install when the venv has none that loads
#                    (default: torch>=2.5 torchvision>=0.20; both always come from one index)
#   TORCH_INDEX_URL  where to get torch and torchvision, e.g. https://download.pytorch.org/whl/cu124 for an
#                    NVIDIA GPU or https://download.pytorch.org/whl/cpu for a small CPU build
#   LAB_ARGS         extra JupyterLab arguments, e.g. LAB_ARGS="--no-browser --port 8899"
#   PYTEST_ARGS      extra pytest arguments, e.g. PYTEST_ARGS="-x -k threads"
#   PYTEST_WORKERS   parallel test processes (default 3; 0 runs everything in one process)
#   START_METHOD     force the default multiprocessing start method of every process of the
#                    test run (fork, forkserver or spawn), e.g. make test START_METHOD=forkserver
#                    to test what Python >= 3.14 on Linux does (tools/start_method/sitecustomize.py)
#   BROWSER_CHECK_ARGS  options for make browser-check, e.g. "notebooks/03_num_workers.ipynb --timeout 900"
#                    (see .venv/bin/python tools/browser_check.py --help)
#   RUNTIMES_ARGS    options for make runtimes, e.g. "--quick-only --lessons 00 03"
#                    (see .venv/bin/python tools/lesson_runtimes.py --help)
#   MUTATION_ARGS    groups for make mutation, e.g. "timing diagnose", or "--hand" for the 13 bugs of
#                    issue 22 put in one at a time (see tools/mutation.py --help)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch>=2.5 torchvision>=0.20
TORCH_INDEX_URL ?=
LAB_ARGS ?=
PYTEST_ARGS ?=
CELL_TIMEOUT ?= 300
# Three pytest processes on 2 cores: with two, a fifth of the CPU time sat idle while tests wait
# (timeouts, slow-starting datasets, process start-up); three took 379 s where two took 456 s.
# --dist loadscope keeps each notebook's cells in one kernel, in order.
# The longest scopes come first (the notebooks, then the longest test files: conftest.py), and
# the many short test files then fill both processes to the end (a long one last would leave
# one process idle).
# Kernels start over IPC, not TCP ports (course_utils/grading/kernels.py says why).
PYTEST_WORKERS ?= 3
START_METHOD ?=
# The suite starts about 400 Python processes (kernels, CLI runs, spawn/forkserver workers,
# torchrun ranks). Where the shell sets PYTHONDONTWRITEBYTECODE, each compiles the course's
# modules again (0.25 CPU-s for one that imports the tools). Empty here: written once, then read.
BYTECODE := PYTHONDONTWRITEBYTECODE=
FORCE_START := $(if $(START_METHOD),COURSE_FORCE_START_METHOD=$(START_METHOD) PYTHONPATH="$(CURDIR)/tools/start_method$${PYTHONPATH:+:$$PYTHONPATH}")
STAMP := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.installed-browser
BROWSER_CHECK_ARGS ?=
RUNTIMES_ARGS ?=
MUTATION_ARGS ?=
MUTATION_STAMP := $(VENV)/.installed-mutation

.PHONY: install lab test quick exercises doctor bench clean browser-check chromium runtimes mutation suite-cpu core-paths site site-check

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is needed; run make PYTHON=python3.11 ..."'
	$(PYTHON) -m venv $(VENV)

# torch and torchvision come first, together, as a matched pair from one index
# (tools/install_torch.py says why): a pair already in the venv that loads is kept. Then the
# optional extras (NVIDIA DALI, TorchCodec): where a platform has no wheel the install goes on
# without them, and the lessons' DALI and TorchCodec cells say why they are skipped.
$(STAMP): pyproject.toml tools/install_torch.py | $(PY)
	$(PY) tools/install_torch.py --spec "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PIP) install -e ".[test]"
	$(PIP) install -e ".[dali,codec,site]" || echo "make: the optional DALI / TorchCodec / site packages did not install here; their cells and tests will say so"
	@touch $@

install: $(STAMP)

# JupyterLab refuses to run as root unless told; containers and some servers run as root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

lab: install
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" $(ALLOW_ROOT) $(LAB_ARGS) notebooks/00_measure_first.ipynb

# make test runs three stages, each with all the CPUs. 1. The quick suite (make quick): every test
# file and the solutions under nbval, within 5 minutes on 2 cores. 2. The lessons
# (tests/test_rerun.py): each top to bottom, then every code cell again in the same kernel; about
# 560 CPU-seconds on 2 cores, its own stage so that the quick suite stays quick. 3. The GPU
# check's rehearsal (every step of tools/device_gpu_check.sh on this CPU), on its own: its step
# timeouts are the GPU run's, so it must not share the CPUs with other tests.
SUITE := COURSE_QUICK=1 MPLBACKEND=Agg $(BYTECODE) $(FORCE_START) $(PY) -m pytest --nbval-lax \
  --nbval-cell-timeout=$(CELL_TIMEOUT) -p course_utils.grading._nbval_kernels \
  -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder
# pytest's exit status 5: a PYTEST_ARGS="-k ..." that selects none of a later stage's tests
NONE_SELECTED_OK := || test $$? -eq 5

quick: install
	$(SUITE) solutions tests --ignore=tests/test_rerun.py $(PYTEST_ARGS)

test: quick
	$(SUITE) tests/test_rerun.py $(PYTEST_ARGS) $(NONE_SELECTED_OK)
	COURSE_REHEARSAL=1 MPLBACKEND=Agg $(BYTECODE) $(FORCE_START) $(PY) -m pytest tests/test_gpu_rehearsal.py \
	  $(PYTEST_ARGS) $(NONE_SELECTED_OK)

exercises: install
	$(PY) -m course_authoring make-exercises

doctor: install
	$(PY) -m course_utils doctor

bench: install
	$(PY) -m course_utils bench

# Opt-in, not part of make test: lesson 00 in JupyterLab in headless Chromium (Debian's
# chromium package; installed here with apt-get when missing and we are root).
$(BROWSER_STAMP): pyproject.toml $(STAMP)
	$(PIP) install -e ".[test,browser]"
	@touch $@

# Chromium for browser-check and site-check: Debian's chromium package, installed with apt-get
# when it is missing and we are root; otherwise the command that installs it, and a failure.
chromium: | $(PY)
	@$(PY) tools/browser_check.py --find-chromium >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Chromium is missing: installing Debian's chromium package"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else \
	    $(PY) tools/browser_check.py --find-chromium; exit 1; \
	  fi

browser-check: $(BROWSER_STAMP) chromium
	$(PY) tools/browser_check.py $(BROWSER_CHECK_ARGS)

# Times every lesson in quick and full mode and rewrites the table in README.md (slow: run it
# on a quiet machine). Raw results: build/lesson_runtimes.json.
runtimes: install
	$(PY) tools/lesson_runtimes.py $(RUNTIMES_ARGS)

# Opt-in, not part of make test (minutes per group): mutmut in a scratch copy, build/mutation/.
$(MUTATION_STAMP): pyproject.toml $(STAMP)
	$(PIP) install -e ".[test,mutation]"
	@touch $@

mutation: $(MUTATION_STAMP)
	$(PY) tools/mutation.py $(MUTATION_ARGS)

# Opt-in: the main suite run one test at a time, each test charged with the machine's busy CPU
# seconds (kernels, subprocesses, workers included), then the report (tools/suite_cpu.py says why:
# on 2 cores the suite is bound by CPU, and wall time = CPU / cores at best). About 14 minutes.
suite-cpu: install
	COURSE_QUICK=1 MPLBACKEND=Agg PYTHONPATH="$(CURDIR)/tools$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m pytest \
	  solutions tests --nbval-lax --nbval-cell-timeout=$(CELL_TIMEOUT) \
	  -p course_utils.grading._nbval_kernels -p suite_cpu -n 0 -q $(PYTEST_ARGS); \
	  status=$$?; $(PY) tools/suite_cpu.py; exit $$status

# The course as a website (course_authoring/site.py): executed here, cached, offline; FULL=1 runs
# the lessons in full mode. site-check opens every page in headless Chromium (installed with
# apt-get when missing and we are root: the chromium target).
site: install
	$(PY) -m course_authoring site $(if $(FULL),--full)

site-check: install chromium
	$(PY) tools/site_check.py build/site

# Each lesson's core path run for real, deep dives skipped, in quick mode (the suite checks the
# same statically, in tests/test_core_paths.py).
core-paths: install
	$(PY) -m course_authoring core-paths --run

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
