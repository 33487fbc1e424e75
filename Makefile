# Two commands do all set-up (see README.md):
#   make test   create/refresh .venv, then run the whole test suite
#   make demo   create/refresh .venv, then run tools/run_demo.sh
#   make test-quick the core in a few minutes: ops against their references,
#                   the attention modules, the equivalence tests, the
#                   package's structure and every config building its model
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

# the inner loop's tier (docs/testing.md); `make test` stays the whole suite
QUICK_TESTS := tests/ops tests/models/test_attention.py \
	tests/models/test_pacs.py tests/models/test_reference.py \
	tests/models/test_reference_variants.py tests/models/test_structure.py \
	tests/test_import_graph.py tests/test_lint.py \
	tests/configs/test_configs_matrix.py::test_config_builds_its_model \
	tests/configs/test_polapp_configs.py::test_config_builds_its_model

test-quick: setup
	$(PY) -m pytest $(QUICK_TESTS) -q $(PYTEST_ARGS)

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
