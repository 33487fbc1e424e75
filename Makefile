# Two commands do all set-up (see README.md):
#   make test   create/refresh .venv, then run the whole test suite
#   make demo   create/refresh .venv, then run tools/run_demo.sh
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test demo clean-venv

setup:
	@bash tools/setup_env.sh

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

demo: setup
	@PATH="$(CURDIR)/.venv/bin:$$PATH" bash tools/run_demo.sh

clean-venv:
	rm -rf .venv
