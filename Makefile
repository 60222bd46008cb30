# gpusteward — two entry points: `make demo` (run it on the local sandbox) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEBIAN_PACKAGES := prometheus chromium gcc libc6-dev debootstrap buildah podman runc \
  containerd containernetworking-plugins iptables

.PHONY: generate setup system-deps venv lint unit component e2e test demo bench bench-quick bench-extender sandbox-build image clean

setup: system-deps venv

# Debian packages the tests and the sandbox use: real Prometheus and promtool, headless Chromium
# for the report's HTML, a C compiler for the NVML test library (sandbox/fakenvml), and
# debootstrap, buildah, podman and runc to build and run the image with no registry, and
# containerd, the CNI plugins and iptables (the bridge plugin's masquerade) for real nodes.
system-deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

# Copies and schemas derived from one source (deploy/tools/generate.py); tests/deploy checks them.
generate: venv
	$(PY) deploy/tools/generate.py

lint: venv
	$(VENV)/bin/ruff check gpusteward tests benchmarks
	$(VENV)/bin/mypy gpusteward
	$(VENV)/bin/lint-imports

unit: venv
	$(PY) -m pytest tests/unit -q

component: setup
	$(PY) -m pytest tests/component -q

# The suite on two workers, one test file at a time each, then the files marked `host` on
# their own (tests/support/parallel.py says why); WORKERS=0 runs it all in one process.
# Both passes run whatever the first gives; the exit status is the first failure's.
WORKERS ?= 2
define pytest_in_passes
	$(if $(filter 0,$(WORKERS)),$(PY) -m pytest $(1) -q,\
	rc=0; $(PY) -m pytest $(1) -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder \
	  -m "not host" || rc=$$?; \
	$(PY) -m pytest $(1) -q -m host || { s=$$?; [ $$s = 5 ] || [ $$rc != 0 ] || rc=$$s; }; \
	exit $$rc)
endef

# Builds the control plane from Go modules on first use (cached under ~/.cache/gpusteward).
e2e: setup
	$(call pytest_in_passes,tests/e2e)

test: setup lint
	$(call pytest_in_passes,tests)

sandbox-build: venv
	$(PY) -m gpusteward.sandbox.build

# The Dockerfile built with buildah on a base made from Debian's packages (no registry needed);
# tagged localhost/gpusteward:dev in gpusteward's own storage under ~/.cache/gpusteward/oci.
image: setup
	$(PY) -m gpusteward.sandbox.image

demo: setup
	$(PY) -m gpusteward.sandbox.demo $(if $(WITH),--with $(WITH))

bench-extender: venv
	$(PY) benchmarks/bench_extender.py

BENCHES := bench_extender bench_scheduler bench_reclaimer bench_telemetry bench_fleetview bench_whatif
# Start-up is measured against the revision before issue 32's work, in the same rounds.
STARTUP_BASE ?= 36c42e7

# Every benchmark, then benchmarks/RESULTS.md and its plots: well over an hour on 2 cores (the
# scheduler at 5,000 nodes took 26 minutes, the reclaimer's sandbox placing 20,000 pods 17.5);
# Thanos is built from its Go module on first use for the telemetry comparison.
bench: setup
	$(PY) -m pip install -q -c constraints.txt -e '.[test,bench]'
	for b in $(BENCHES); do $(PY) benchmarks/$$b.py || exit 1; done
	$(PY) benchmarks/bench_startup.py --base $(STARTUP_BASE)
	$(PY) benchmarks/bench_startup.py --base $(STARTUP_BASE) --no-bytecode-cache
	$(PY) benchmarks/report.py

# CI: each benchmark at a tiny size, to prove they still run (no figures written).
bench-quick: setup
	for b in $(BENCHES) bench_startup; do $(PY) benchmarks/$$b.py --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
