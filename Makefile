# The two commands of the README.
.PHONY: run test setup
run:      ## install everything, then run the inference server + workbench on the embedded model
	scripts/run.sh
test:     ## install everything (chromium too), then run the test suite
	scripts/test.sh
setup:
	scripts/setup.sh
