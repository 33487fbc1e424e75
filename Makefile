# Two commands do all set-up (see README.md):
#   make test   create/refresh .venv, then run the whole test suite
#   make demo   create/refresh .venv, then run tools/run_demo.sh
#   make gpu-check  the GPU checks (tools/gpu_check.sh; skips without a GPU)
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test demo clean-venv gpu-check

setup:
	@bash tools/setup_env.sh

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

demo: setup
	@PATH="$(CURDIR)/.venv/bin:$$PATH" bash tools/run_demo.sh

# CUDA tests, benchmark and memory on a GPU (one line and exit 0 without)
gpu-check:
	@bash tools/gpu_check.sh

clean-venv:
	rm -rf .venv
