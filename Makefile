# Quick start: `make demo` (install + run the bundled demo), `make test` (install + all checks).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: demo test test-long lint install install-test system-packages bench smoke-py312 test-titan-main

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip runs only when what was installed changed: $(VENV)/.installed-* records the torch
# pin, the extras and a hash of pyproject.toml; a second `make demo` goes straight to the demo.
# `rm $(VENV)/.installed-*` forces a reinstall. The package is editable: code edits need none.
TORCH := torch==2.13.0
TEST_EXTRAS := test,torchtitan,trainer,report,testing,bench,parquet,multimodal,ray,chat,s3,gcs,azure,hf,http
PYPROJECT_HASH = $(shell $(PYTHON) -c "import hashlib; print(hashlib.sha256(open('pyproject.toml', 'rb').read()).hexdigest()[:16])")
# $(call pip_install,EXTRAS,NAME[,SUPERSET_EXTRAS,SUPERSET_NAME]): pip install the package with
# EXTRAS unless .installed-NAME (or the stamp of a superset of them) records this very torch pin,
# these extras and this pyproject.toml.
stamp_line = $(TORCH) extras=[$(1)] pyproject=$(PYPROJECT_HASH)
define pip_install
	@if [ "$$(cat $(VENV)/.installed-$(2) 2>/dev/null)" = "$(call stamp_line,$(1))" ]; then \
	  echo "make: $(2) install up to date ($(VENV)/.installed-$(2) matches pyproject.toml)"; \
	elif [ -n "$(4)" ] && [ "$$(cat $(VENV)/.installed-$(4) 2>/dev/null)" = "$(call stamp_line,$(3))" ]; then \
	  echo "make: $(2) install up to date ($(VENV)/.installed-$(4) matches pyproject.toml)"; \
	else \
	  echo "$(PIP) install -q $(TORCH) && $(PIP) install -q -e '.$(if $(1),[$(1)])'"; \
	  rm -f $(VENV)/.installed-$(2); \
	  $(PIP) install -q $(TORCH) && $(PIP) install -q -e '.$(if $(1),[$(1)])' \
	    && echo "$(call stamp_line,$(1))" > $(VENV)/.installed-$(2); \
	fi
endef

install: $(BIN)/python
	$(call pip_install,,base,$(TEST_EXTRAS),test)

# The system packages the storage tests need, as COMMAND:PACKAGE: nginx (the HTTP server; it
# honours Range requests), Node.js and npm (Azurite, the Azure Blob server, is an npm package).
# A missing one is installed with apt-get when make runs as root; otherwise, or if apt-get
# fails, make stops with one line naming the package and how to install it.
SYSTEM_PACKAGES ?= nginx:nginx node:nodejs npm:npm
APT_GET ?= apt-get
APT_LOG ?= $(or $(TMPDIR),/tmp)/zephon-apt-get.log
system-packages:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
	  cmd=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$cmd >/dev/null || [ -x /usr/sbin/$$cmd ] || missing="$$missing $$pkg"; \
	done; missing=$${missing# }; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	how="install it and run make test again: sudo apt-get install -y $$missing"; \
	if [ "$$(id -u)" != 0 ] || ! command -v $(APT_GET) >/dev/null; then \
	  echo "error: the tests need the system package(s) $$missing (not root, or no apt-get): $$how" >&2; exit 2; \
	fi; \
	echo "make: installing $$missing with apt-get (the storage tests' servers; log: $(APT_LOG))"; \
	{ $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing; } \
	  >$(APT_LOG) 2>&1 || { echo "error: apt-get could not install $$missing (see $(APT_LOG)): $$how" >&2; exit 2; }

# Azurite, the Azure Blob server of the storage tests, from npm into a project-local folder
# (pinned by .ci/node/package-lock.json); the stamp skips npm when nothing changed.
AZURITE_STAMP := .ci/node/node_modules/.installed

$(AZURITE_STAMP): .ci/node/package.json .ci/node/package-lock.json | system-packages
	npm ci --prefix .ci/node --no-audit --no-fund --loglevel=error
	touch $@

# The writers and readers of the pre-tokenized corpora tests (tests/io/pretokenized_corpora.py):
# megatron-core, mosaicml-streaming, litdata and the few pure-Python or wheel modules they
# import, pinned, with --no-deps into a side folder that only those tests put on sys.path
# (their own dependencies would change the venv's torch and numpy). zephon never imports them.
SIDE_FORMATS := .side-formats
SIDE_FORMATS_PINS := megatron-core==0.16.1 mosaicml-streaming==0.13.0 litdata==0.2.76 \
  lightning-utilities==0.15.3 brotli==1.2.1 python-snappy==0.7.3 cramjam==2.14.0 \
  zstd==1.5.7.2 catalogue==2.0.10

$(SIDE_FORMATS)/.stamp: Makefile $(BIN)/python
	rm -rf $(SIDE_FORMATS)
	$(PIP) install -q --no-deps --target $(SIDE_FORMATS) $(SIDE_FORMATS_PINS)
	mkdir -p $(SIDE_FORMATS)
	echo "$(SIDE_FORMATS_PINS)" > $@

install-test: $(BIN)/python system-packages $(AZURITE_STAMP) $(SIDE_FORMATS)/.stamp
	$(call pip_install,$(TEST_EXTRAS),test)

demo: install
	$(BIN)/zephon demo

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python .ci/check_cycles.py

test: lint
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest --durations=25

# The long scenarios that `make test` runs shortened (not run by CI): ZEPHON_FULL_SCENARIOS=1
# gives the example and fault tests their long sizes (20 kills, every dp size, more steps);
# each test's docstring says what CI runs instead. About 13 minutes on 2 cores (their CI time
# before the trim). Its Hypothesis examples are new at every run (profile "long"; CI's are
# derandomized: the same examples each time).
LONG ?= tests/examples tests/fault/test_kill_resume.py tests/engine/test_timeline_property.py
test-long: install-test
	ZEPHON_FULL_SCENARIOS=1 HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest --durations=25 \
	  --hypothesis-show-statistics $(LONG)

# The second supported Python: a small smoke subset in its own venv (CI runs it after `test`).
# torch for 3.12 comes from PyPI as a CUDA build of several GB; pip's cache keeps the download.
PY312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
VENV312 ?= .venv312
SMOKE ?= tests/core/test_recipe.py tests/core/test_elastic_properties.py tests/core/test_state_size.py \
	tests/core/test_optional_imports.py tests/testing/test_save_load.py tests/commands/test_digest_dump.py
smoke-py312:
	test -x $(VENV312)/bin/python || $(PY312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q torch==2.13.0
	$(VENV312)/bin/python -m pip install -q -e '.[test,parquet]'
	HYPOTHESIS_PROFILE=ci $(VENV312)/bin/python -m pytest -p no:cacheprovider $(SMOKE)

# Benchmarks side by side with Grain / TorchTitan / torchdata.nodes (see docs/performance.md).
# The Python docs (English text for the corpus) are optional: without them only stdlib code.
bench: install-test
	-DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-doc
	$(BIN)/python -m benchmarks.run --json bench-results.json

# TorchTitan main (not on PyPI): its own venv with the vendored snapshot (../shared/vendor),
# the CPU torch first (so pip never pulls a CUDA build), then the main-adapter tests only.
# The stamp makes a second call skip pip; another TITAN_MAIN_SRC (recorded in .src) or a
# newer pyproject.toml rebuilds it; delete $(VENV_TITAN_MAIN) to rebuild by hand.
TITAN_MAIN_SRC ?= ../shared/vendor/torchtitan-b5bcd76.tar.gz
VENV_TITAN_MAIN ?= .venv-titan-main
$(VENV_TITAN_MAIN)/.src: FORCE
	@test -e $(TITAN_MAIN_SRC) || { echo "error: TITAN_MAIN_SRC=$(TITAN_MAIN_SRC) does not exist: TorchTitan main's source is the snapshot in ../shared/vendor beside this clone, or set TITAN_MAIN_SRC to a TorchTitan checkout at b5bcd76" >&2; exit 2; }
	@mkdir -p $(VENV_TITAN_MAIN)
	@echo '$(TITAN_MAIN_SRC)' | cmp -s - $@ || echo '$(TITAN_MAIN_SRC)' > $@
$(VENV_TITAN_MAIN)/.stamp: pyproject.toml $(VENV_TITAN_MAIN)/.src
	test -x $(VENV_TITAN_MAIN)/bin/python || $(PYTHON) -m venv $(VENV_TITAN_MAIN)
	$(VENV_TITAN_MAIN)/bin/python -m pip install -q torch==2.13.0
	$(VENV_TITAN_MAIN)/bin/python -m pip install -q $(TITAN_MAIN_SRC) 'triton>=3.9,<3.10'
	$(VENV_TITAN_MAIN)/bin/python -m pip install -q -e '.[testing]' 'pytest>=8' 'tokenizers>=0.19'
	$(VENV_TITAN_MAIN)/bin/python -c "import torch; v = torch.__version__; assert v.startswith('2.13.0') and torch.version.cuda is None, v"
	touch $@
test-titan-main: $(VENV_TITAN_MAIN)/.stamp
	HYPOTHESIS_PROFILE=ci $(VENV_TITAN_MAIN)/bin/python -m pytest -p no:cacheprovider tests/integrations/titan_main tests/integrations/test_cross_adapter.py

.PHONY: FORCE
FORCE:
