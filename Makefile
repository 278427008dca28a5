# llama3-triton: build, serve and test a Triton model repository for Llama 3 Instruct.
# The two commands a newcomer needs: `make serve` and `make test` (both do all set-up).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

# What `make repo` builds. ENGINE=embedded (default, CPU) or ENGINE=trtllm (GPU, TensorRT-LLM 1.2.x).
ENGINE ?= embedded
REPO ?= build/model_repository
ASSETS ?= build/assets
HF_MODEL ?=
DRAFT_HF_MODEL ?=
TP ?= 1
PP ?= 1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SERVER_URL ?=
BUILD := $(PY) -m engine_build

.PHONY: setup repo serve test bench soak clean help

help:
	@echo "make serve   build the default repository (embedded CPU engine) and start tritonserver"
	@echo "make test    set up and run the unit + integration tests"
	@echo "make repo    build the repository only (ENGINE=trtllm HF_MODEL=... on a GPU box)"
	@echo "make bench   print the benchmark tables"
	@echo "make clean   remove build outputs (keeps the venv; 'make distclean' removes it too)"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[server,engine,assets,quantize,test]"
	$(PY) -m engine_build.server install-stub
	@rm -f $(VENV)/.installed-*; touch $@

repo: setup
	$(BUILD) repo --engine $(ENGINE) --repo $(REPO) --assets $(ASSETS) \
	    $(if $(HF_MODEL),--hf-model $(HF_MODEL)) $(if $(DRAFT_HF_MODEL),--draft-hf-model $(DRAFT_HF_MODEL)) \
	    --tp $(TP) --pp $(PP)

serve: repo
	$(PY) -m engine_build.server serve --repo $(REPO) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
	    --metrics-port $(METRICS_PORT) --world-size $$(( $(TP) * $(PP) ))

test: repo
	$(PY) -m pytest -q tests --repo $(REPO) $(if $(SERVER_URL),--server-url $(SERVER_URL))

bench: repo
	$(PY) -m tools.bench --repo $(REPO)

soak: repo
	$(PY) -m tools.soak --repo $(REPO) $(if $(DURATION),--duration $(DURATION)) $(if $(CONCURRENCY),--concurrency $(CONCURRENCY))

clean:
	rm -rf build .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
