# knotless-run: the two commands a fresh machine needs are `make demo` (the
# example workflow as a run) and `make test` (the whole suite, with the
# real cluster, daemons and checks it needs, brought up and torn down).
GO      ?= go
BIN     := bin/knotless-run
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X knotless.dev/run/internal/lib/version.Version=$(VERSION)

.PHONY: build test test-short demo demo-shell vet fmt

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/knotless-run

# The whole suite: unit, conformance and integration tests on real servers.
test:
	bash tests/run-all.sh

# Unit tests only; integration tests skip loudly.
test-short:
	$(GO) test -short ./...

# The example workflow, run by the shell executor (needs nothing else).
demo-shell: build
	$(BIN) run --executor shell --workflow examples/hello/.knotless/workflows/build.yaml \
		--workdir examples/hello --outputs out/demo --result out/demo-result.json

# The example workflow as a Job on the repo's own local cluster (brought
# up and taken down again; KEEP_CLUSTER=1 keeps it).
demo: build
	bash examples/demo.sh

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')
