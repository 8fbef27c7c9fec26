# collectived — the two commands a new user needs:
#   make demo   build, start a ring of 3 daemons x 2 trainers on loopback,
#               allreduce, print verified results and bandwidth, stop all
#   make test   everything the project checks, set-up included
#
# Both do their own set-up on a fresh machine (scripts/setup.sh): Debian
# packages, Go modules, a Python venv with the client's test packages.

GO      ?= go
BIN     := bin/collectived
VENV    := .venv
PY      := $(VENV)/bin/python
# Debian's python3 with Debian's python3-torch: the PyTorch tests (torch
# helpers, train_torch.py), which .venv, without torch, skips.
TORCH_PY := .venv-torch/bin/python
SETUP   := .setup-done
GOTEST_FLAGS ?= -race -timeout 20m

.PHONY: all build cclient demo test setup lint gotest pytest ctest bench clean fuzz-short fuzz-long

all: build cclient

$(SETUP): scripts/setup.sh clients/python/pyproject.toml clients/python/setup.py clients/python/src/collectived/_lanewords.c
	bash scripts/setup.sh
	touch $@

setup: $(SETUP)

build:
	$(GO) build -o $(BIN) ./cmd/collectived

# The C client: clients/c/build/libcollectived.a, libcollectived.so and the
# example program.
cclient:
	$(MAKE) -C clients/c all

demo: $(SETUP) build
	./$(BIN) bench --nodes 3 --local 2 --sizes 4,4096,65536,1048576,16777216 --iters 20

lint: $(SETUP)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(PY) -m mypy --strict clients/python/src/collectived

# The ring again with -tags purego: the portable reduce kernels alone, as
# on a CPU without AVX2 (ring/kernel_amd64.go installs the vector ones).
gotest: build
	COLLECTIVED_BIN=$(CURDIR)/$(BIN) $(GO) test $(GOTEST_FLAGS) ./...
	$(GO) vet -tags purego ./ring/
	$(GO) test -tags purego -timeout 10m ./ring/

pytest: build
	COLLECTIVED_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q clients/python/tests bench/test_bench.py bench/test_ddp_step.py
	$(TORCH_PY) -c 'import torch' || { echo "no torch in $(TORCH_PY): run scripts/setup.sh"; exit 1; }
	COLLECTIVED_BIN=$(CURDIR)/$(BIN) $(TORCH_PY) -m pytest -q -k torch clients/python/tests

# The C tests run plain and under AddressSanitizer and UBSan (a use after
# free in a test passed plain two runs in four).
ctest: build
	COLLECTIVED_BIN=$(CURDIR)/$(BIN) $(MAKE) -C clients/c test
	COLLECTIVED_BIN=$(CURDIR)/$(BIN) $(MAKE) -C clients/c asan-test

test: $(SETUP) lint gotest fuzz-short pytest ctest

# Every decoder of untrusted bytes has a fuzz target; their seed corpora run
# in every go test. fuzz-short fuzzes each in CI for a fixed number of
# executions (about 8 s each here); fuzz-long is the long run
# (docs/SECURITY.md). Budgets are counts, not durations: a duration
# -fuzztime races Go's fuzz coordinator at the deadline and fails with a
# bare "context deadline exceeded" and no crasher (golang/go#75804, fixed
# only in Go 1.27); a count has no deadline to race.
FUZZ_TARGETS := ipc:FuzzDecodeFrame:160000 ipc:FuzzLaneTake:100000 ring:FuzzDecodeHeader:300000 \
	ring:FuzzRingStream:20000 rendezvous:FuzzDecodeHello:300000 config:FuzzParse:60000
FUZZMULT ?= 1
fuzz-short:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; n=$$(( $${rest##*:} * $(FUZZMULT) )); \
		echo "fuzz $$fn ($$pkg) for $$n executions"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $${n}x -timeout 0 ./$$pkg/ || exit 1; \
	done

fuzz-long:
	$(MAKE) fuzz-short FUZZMULT=75

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 20x ./ring/ ./collective/

clean:
	rm -rf bin $(SETUP) $(VENV) .venv-torch
	$(MAKE) -C clients/c clean
