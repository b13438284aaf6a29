# Two entry points: `make demo` (the main job) and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat setup.py | sha1sum | cut -c1-12)
# pip byte-compiles what it installs on one core; compileall after it uses
# every core (the same .pyc files; about 10 s less on 2 cores).
INSTALL := $(PY) -m pip install --quiet --no-compile
BYTECOMPILE := $(PY) -m compileall -qq -j 0 $(VENV)/lib

.PHONY: demo test test-quick venv clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(INSTALL) -e '.[test]' --config-settings editable_mode=compat
	$(BYTECOMPILE)
	rm -f $(VENV)/.installed-* && touch $@

# libtpu (about 700 MB) for the TPU compile checks of `make test`
# (tests/test_tpu_compile.py, scripts/plan_run.py): the real TPU compiler,
# compiling for TPU slices that are not there. pip has libtpu for Linux on
# x86_64 only: there a failed install fails `make test` (as the TPU tests
# would: they are its only checks of the TPU programs); elsewhere the tests
# skip and say why. It also installs everything $(STAMP) does, so
# `make demo` after `make test` installs nothing.
TPU_STAMP := $(VENV)/.libtpu-$(shell cat setup.py | sha1sum | cut -c1-12)
LIBTPU_PLATFORM := $(shell test "$$(uname -s)-$$(uname -m)" = Linux-x86_64 && echo yes)

# One pip run for both on a fresh machine (a second would resolve again).
$(TPU_STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
ifeq ($(LIBTPU_PLATFORM),yes)
	$(INSTALL) -e '.[test,tpu]' --config-settings editable_mode=compat
else
	@echo "libtpu has no build for $$(uname -s) $$(uname -m): the TPU compile tests will skip"
	$(INSTALL) -e '.[test]' --config-settings editable_mode=compat
endif
	$(BYTECOMPILE)
	rm -f $(VENV)/.installed-* $(VENV)/.libtpu-* && touch $(STAMP) $@

venv: $(STAMP)

# Extra flags, e.g. make demo DEMO_FLAGS="--gin.demo.DemoConfig.variant=\"'default'\""
DEMO_FLAGS ?=

demo: $(STAMP)
	$(PY) scripts/demo.py --workdir=results/demo $(DEMO_FLAGS)

# Two worker processes (pytest-xdist), each test module in one of them: XLA
# compiles on one core at a time, so two processes keep both busy; a third
# was slower on 2 cores (the suite: 13 to 21 min on the 2-core machines
# measured, which differ by 1.8x; docs/log/suite_timing.md has the
# measurements, docs/reliability.md says what it checks). Modules go out
# slowest first (tests/conftest.py), in that order. TEST_FLAGS="-n 0" runs
# in one; pytest lists the 25 slowest tests.
TEST_FLAGS ?= -n 2 --dist loadfile --no-loadscope-reorder --durations=25

test: $(TPU_STAMP)
	$(PY) -m pytest -q $(TEST_FLAGS) tests

# The tests marked `quick` (pytest -m quick): a few minutes, for iteration.
# CI runs everything (`make test`).
test-quick: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=10 -m quick tests

clean:
	rm -rf $(VENV)
