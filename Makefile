# Two commands do all set-up (see README.md):
#   make test   create/refresh .venv, then run the whole test suite
#   make demo   create/refresh .venv, then run tools/run_demo.sh
#   make test-quick the quick tier, pytest -m "not slow" (docs/testing.md):
#                   ops against their references, the attention modules, the
#                   equivalence tests, the package's structure, every config
#                   building its model; 725 tests in about 2 min on 2
#                   idle cores (measured 2026-12-07)
#   make gpu-check  the GPU checks (tools/gpu_check.sh; skips without a GPU)
#   make test-compat  build each compatibility stack in .venv-compat/<stack>
#                   and run the compatibility suite there (docs/compat.md);
#                   STACKS="torch2.1 torch2.15" for both (default torch2.1)
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-quick demo clean-venv gpu-check test-compat clean-compat

setup:
	@bash tools/setup_env.sh

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

# the inner loop's tier: the tests not marked slow (the markers: setup.cfg);
# `make test` stays the whole suite
test-quick: setup
	$(PY) -m pytest tests -m "not slow" -q $(PYTEST_ARGS)

demo: setup
	@PATH="$(CURDIR)/.venv/bin:$$PATH" bash tools/run_demo.sh

# CUDA tests, benchmark and memory on a GPU (one line and exit 0 without)
gpu-check:
	@bash tools/gpu_check.sh

clean-venv:
	rm -rf .venv

# compatibility stacks: requirements/compat-<stack>.txt pins torch (and numpy);
# tools/setup_compat_env.sh builds .venv-compat/<stack>, tools/compat_suite.py
# installs a pola_mm wheel there and runs tests/compat/suite.txt from a fresh
# folder outside the checkout. Every stack runs; the exit status is 1 if any
# failed.
STACKS ?= torch2.1

test-compat:
	@status=0; for stack in $(STACKS); do \
	  if bash tools/setup_compat_env.sh $$stack; then \
	    .venv-compat/$$stack/bin/python tools/compat_suite.py $$stack \
	      $(PYTEST_ARGS) || status=1; \
	  else status=1; fi; \
	done; exit $$status

clean-compat:
	rm -rf .venv-compat
