# The two commands of the README, and the inner loop's.
.PHONY: run test setup lint test-fast
run:      ## install everything, then run the inference server + workbench on the embedded model
	scripts/run.sh
test:     ## install everything (chromium too), then run the test suite
	scripts/test.sh
setup:
	scripts/setup.sh
lint:     ## ruff check, then mypy, as CI runs them first (scripts/lint.sh; needs scripts/setup.sh's .venv)
	scripts/lint.sh
# No set-up, no model, no browser: every test but the `model` (llama.cpp on the embedded model) and
# `browser` (Chromium) ones, one process per physical core as in `make test`. ARGS=... goes to pytest.
test-fast:  ## the inner loop: the suite without the real-model and browser tests (needs .venv)
	.venv/bin/python -m pytest -m "not model and not browser" --dist loadfile \
	  -n "$$(.venv/bin/python -c 'from server.settings import physical_cores; print(physical_cores())')" $(ARGS)
