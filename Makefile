# llama3-triton: build, serve and test a Triton model repository for Llama 3 Instruct.
# The two commands a newcomer needs: `make serve` and `make test` (both do all set-up). The fast loop while changing
# code: `make lint` and `make unit` (no server, no build).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# In the NGC TensorRT-LLM container (tritonserver on PATH) its python3 already has torch, transformers, modelopt and
# tensorrt_llm: use it and install nothing (every command runs from this checkout, so an air-gapped container needs
# no package index). Elsewhere: a venv with every extra.
SYSTEM_PYTHON ?= $(if $(shell command -v tritonserver),1,)
ifeq ($(SYSTEM_PYTHON),1)
PY := $(PYTHON)
STAMP := build/.installed-system
INSTALL := @echo "container Python ($$(command -v $(PYTHON))): nothing to install, commands run from this checkout"
TEST_VENV ?= build/venv-test
TEST_PY := $(TEST_VENV)/bin/python
TEST_SETUP := $(TEST_VENV)/.installed
else
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
INSTALL := $(PY) -m pip install -q -e ".[server,engine,assets,quantize,test,api,dev]"
TEST_PY := $(PY)
TEST_SETUP := setup
endif

# What `make repo` builds. ENGINE=embedded (default, CPU), ENGINE=trtllm (GPU, TensorRT-LLM 1.2.x engines) or
# ENGINE=llmapi (TensorRT-LLM's LLM API on the PyTorch backend; without HF_MODEL, its CPU stand-in: docs/gpu.md).
ENGINE ?= embedded
REPO ?= build/model_repository
ASSETS ?= build/assets
HF_MODEL ?=
DRAFT_HF_MODEL ?=
# ENGINE=trtllm draft: none (bf16, TensorRT-LLM's documented draft-target choice) or awq.
DRAFT_QUANT ?= none
# LORA_DIR=<dir>: one Hugging Face PEFT LoRA adapter per subfolder (its name is the adapter's), converted and served
# by name (lora_name) or task id (docs/lora.md).
LORA_DIR ?=
TP ?= 1
PP ?= 1
# DECOUPLED=false: unary (non-streaming) models, for clients that use ModelInfer (upstream's decoupled_mode).
DECOUPLED ?= true
# EXCLUDE_INPUT_IN_OUTPUT=false: a request that does not say gets the prompt echoed (the backend's own default, for
# token-level clients that read it back in output_ids); true (default, as NVIDIA's Llama guide): no echo.
EXCLUDE_INPUT_IN_OUTPUT ?= true
# QUERY_SPECIAL_TOKENS=parse: text_input may carry control tokens (for Triton's OpenAI frontend; docs/compatibility.md).
QUERY_SPECIAL_TOKENS ?= text
# ENGINE=trtllm guided decoding: xgrammar (the tokenizer info file beside each engine) or none (its keys left unset).
GUIDED_DECODING ?= xgrammar
# ENGINE=trtllm sizing (engine_build/gpu_plan.py): PROFILE=throughput|latency, any single value overridable;
# DRY_RUN=1 plans, renders and prints the commands without a GPU (GPU_MEM_GB=80 to plan for an 80 GB GPU).
PROFILE ?= throughput
# ENGINE=llmapi: QUANT=awq (W4A16 AWQ, default) or fp8; GPU_ARCH=ampere|ada|hopper|blackwell (or 8.9) plans for a GPU
# that is not here (DRY_RUN); SPECULATIVE=ngram|eagle3|draft_target, EAGLE_DIR=<EAGLE-3 draft head>.
QUANT ?= awq
GPU_ARCH ?=
SPECULATIVE ?=
EAGLE_DIR ?=
# Draft tokens a step verifies (a draft model, and ENGINE=llmapi's speculation); default 8.
MAX_DRAFT_LEN ?=
# SERVE_PATH=/models/llama3: where the repository will be served (the C++ backend opens gpt_model_path as given).
SERVE_PATH ?=
DRY_RUN ?=
GPU_MEM_GB ?=
KV_CACHE_DTYPE ?= auto
MAX_BATCH_SIZE ?=
MAX_NUM_TOKENS ?=
MAX_INPUT_LEN ?=
MAX_SEQ_LEN ?=
KV_CACHE_FRACTION ?=
BATCH_SCHEDULER_POLICY ?=
ENABLE_CHUNKED_CONTEXT ?=
# tensorrt_llm_bls instances; default: streaming (the relay), one per 4 cores of the host that runs `make repo`, 1 to 8;
# unary (one request at a time each), one per core, 4 to 32.
BLS_INSTANCES ?=
# preprocessing / postprocessing instances (the ensemble's Python steps; postprocessing runs once per streamed
# token); default: preprocessing one per 4 cores of the host that runs `make repo`, 1 to 8; postprocessing one per
# 2 cores, 1 to 16.
PREPROCESSING_INSTANCES ?=
POSTPROCESSING_INSTANCES ?=
# Streaming repositories: threads that re-send the engine's responses to the ensemble, where Triton schedules the
# ensemble's next step (relay/handoff.h). Default: one per 4 cores of the host that runs `make repo`, 1 to 8.
HANDOFF_SENDER_THREADS ?=
# tensorrt_llm_bls: new tokens per streamed response (1: every token); larger values cost the BLS less CPU.
STREAM_INTERVAL ?= 1
SIZING = --profile $(PROFILE) --kv-cache-dtype $(KV_CACHE_DTYPE) $(if $(DRY_RUN),--dry-run) \
    $(if $(SERVE_PATH),--serve-path $(SERVE_PATH)) $(if $(BLS_INSTANCES),--bls-instances $(BLS_INSTANCES)) \
    $(if $(PREPROCESSING_INSTANCES),--preprocessing-instances $(PREPROCESSING_INSTANCES)) \
    $(if $(POSTPROCESSING_INSTANCES),--postprocessing-instances $(POSTPROCESSING_INSTANCES)) \
    $(if $(HANDOFF_SENDER_THREADS),--handoff-sender-threads $(HANDOFF_SENDER_THREADS)) \
    --stream-interval $(STREAM_INTERVAL) --guided-decoding $(GUIDED_DECODING) \
    $(if $(GPU_MEM_GB),--gpu-mem-gb $(GPU_MEM_GB)) $(if $(MAX_BATCH_SIZE),--max-batch-size $(MAX_BATCH_SIZE)) \
    $(if $(MAX_NUM_TOKENS),--max-num-tokens $(MAX_NUM_TOKENS)) $(if $(MAX_INPUT_LEN),--max-input-len $(MAX_INPUT_LEN)) \
    $(if $(MAX_SEQ_LEN),--max-seq-len $(MAX_SEQ_LEN)) $(if $(KV_CACHE_FRACTION),--kv-cache-fraction $(KV_CACHE_FRACTION)) \
    $(if $(BATCH_SCHEDULER_POLICY),--batch-scheduler-policy $(BATCH_SCHEDULER_POLICY)) \
    $(if $(filter true,$(ENABLE_CHUNKED_CONTEXT)),--enable-chunked-context) \
    $(if $(filter false,$(ENABLE_CHUNKED_CONTEXT)),--no-enable-chunked-context)
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SERVER_URL ?=
# The OpenAI-compatible API `make serve` / `make serve-only` start beside tritonserver (docs/openai.md): loopback by
# default; API_PORT=0: none; API_KEY=...: clients must send it (Authorization: Bearer), kept in a 0600 file, not argv.
# API_WORKERS=N: its worker processes (default: one per 4 cores, at least one).
API_HOST ?= 127.0.0.1
API_PORT ?= 9000
API_WORKERS ?=
API_KEY ?=
API_KEY_FILE := build/api_keys
BUILD := $(PY) -m engine_build

.PHONY: setup repo llmapi-repo serve serve-only check-repo lint unit test test-llmapi rehearse system-packages bench soak dist clean distclean help

help:
	@echo "make serve   build the default repository (embedded CPU engine) and start tritonserver"
	@echo "make test    set up and run lint, the unit and the integration tests, the container rehearsal"
	@echo "make lint    ruff (Python), and the C++ (relay/, the bench's send_cpp and engine) compiled with warnings as errors"
	@echo "make test-llmapi   the integration tests against the LLM API flow's CPU stand-in (ENGINE=llmapi)"
	@echo "make unit    the unit tests only: no server, no build (those needing make repo's assets skip, saying so)"
	@echo "make repo    build the repository only (ENGINE=trtllm|llmapi HF_MODEL=... on a GPU box; DRY_RUN=1 anywhere)"
	@echo "make check-repo REPO=...   static load check of a built repository (what would fail in the container)"
	@echo "make rehearse   the README's container commands in a reproduction of the 26.07 image (root; make test runs it)"
	@echo "make serve-only REPO=...   check, then serve an existing repository (builds nothing; docs/container.md)"
	@echo "make bench   print the benchmark tables"
	@echo "make soak    concurrent mixed load with faults (DURATION=seconds CONCURRENCY=clients)"
	@echo "make perf-analyzer / make genai-perf   Triton's own load tools (PERF_URL=host:port)"
	@echo "make gpu-bench   trtllm-bench + genai-perf on a built TensorRT-LLM repository (in the container)"
	@echo "make dist    pack the built repository into build/dist/*.tar.gz (with its manifest)"
	@echo "make clean   remove build outputs (keeps the venv; 'make distclean' removes it too)"

setup: $(STAMP)

$(STAMP): pyproject.toml
ifneq ($(SYSTEM_PYTHON),1)
	$(PYTHON) tools/system_packages.py --serving
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@rm -f $(VENV)/.installed-*
endif
	$(INSTALL)
	$(PY) -m serving.tritonserver install-stub
	@mkdir -p $(dir $@); touch $@

repo: setup
	$(BUILD) repo --engine $(ENGINE) --repo $(REPO) --assets $(ASSETS) \
	    $(if $(HF_MODEL),--hf-model $(HF_MODEL)) $(if $(DRAFT_HF_MODEL),--draft-hf-model $(DRAFT_HF_MODEL)) \
	    --draft-quant $(DRAFT_QUANT) $(if $(LORA_DIR),--lora-dir $(LORA_DIR)) \
	    --tp $(TP) --pp $(PP) $(if $(filter false,$(DECOUPLED)),--no-decoupled) \
	    --query-special-tokens $(QUERY_SPECIAL_TOKENS) $(if $(filter false,$(EXCLUDE_INPUT_IN_OUTPUT)),--no-exclude-input-in-output) \
	    --quant $(QUANT) $(if $(GPU_ARCH),--gpu-arch $(GPU_ARCH)) $(if $(SPECULATIVE),--speculative $(SPECULATIVE)) \
	    $(if $(EAGLE_DIR),--eagle-dir $(EAGLE_DIR)) $(if $(MAX_DRAFT_LEN),--max-draft-len $(MAX_DRAFT_LEN)) $(SIZING)

# The API runs on the test clients' Python (in the container: their venv, which has the api pins; elsewhere: .venv).
SERVE = $(PY) -m serving.tritonserver serve --repo $(REPO) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
	    --metrics-port $(METRICS_PORT) --api-host $(API_HOST) --api-port $(API_PORT) --api-python $(TEST_PY) \
	    $(if $(API_KEY),--api-key-file $(API_KEY_FILE)) $(if $(API_WORKERS),--api-workers $(API_WORKERS))
export API_KEY
WRITE_API_KEY = $(if $(API_KEY),@umask 077 && mkdir -p build && printf '%s\n' "$$API_KEY" > $(API_KEY_FILE),@:)

serve: repo
	$(WRITE_API_KEY)
	$(SERVE)

# An existing repository (e.g. one `make repo ENGINE=trtllm` built in the 26.07 container), served as it is: no build;
# the launch mode and world size come from its repository.json. check-repo runs first. The only set-up: the venv the
# OpenAI API runs from (the test clients', TEST_SETUP), unless API_PORT=0.
serve-only: check-repo $(if $(filter-out 0,$(API_PORT)),$(TEST_SETUP))
	$(WRITE_API_KEY)
	$(SERVE)

# The static load check (engine_build/check_repo.py); needs only Python and this checkout, no set-up.
check-repo:
	$(PY) -m engine_build check-repo --repo $(REPO)

# With SERVER_URL (a running server, e.g. the NGC container's) the tests use it as is and build nothing: tests that
# need the embedded engine or start their own server skip themselves, naming why (tests/integration/conftest.py).
# In the container the test clients run in their own venv ($(TEST_VENV)): tritonclient pins protobuf<5, which must
# not replace the container's (TensorRT-LLM 1.2.1 needs protobuf>=6.33.5).
# Without SERVER_URL, last: the container rehearsal (REHEARSAL=0 skips it; it needs root).
# Then (ENGINE other than llmapi) the LLM API flow on its CPU stand-in: its own repository (LLMAPI_REPO, same assets)
# and LLMAPI_TESTS against it (about 5 minutes on 2 cores); `make test-llmapi` runs the whole suite against it.
REHEARSAL ?= 1
LLMAPI_REPO ?= build/model_repository_llmapi
LLMAPI_TESTS ?= test_llmapi.py test_engine.py test_bls.py test_openai_api.py test_guided.py test_lora.py
test: $(if $(SERVER_URL),,system-packages) lint $(if $(SERVER_URL),$(TEST_SETUP),repo)
	$(MAKE) --no-print-directory unit
	$(TEST_PY) -m pytest -q tests/integration --repo $(REPO) $(if $(SERVER_URL),--server-url $(SERVER_URL))
ifeq ($(SERVER_URL),)
ifneq ($(ENGINE),llmapi)
	$(MAKE) --no-print-directory llmapi-repo
	$(TEST_PY) -m pytest -q $(addprefix tests/integration/,$(LLMAPI_TESTS)) --repo $(LLMAPI_REPO)
endif
ifeq ($(REHEARSAL),1)
	$(MAKE) --no-print-directory rehearse
endif
endif

# The stand-in LLM API repository, `make repo ENGINE=llmapi` without HF_MODEL: the options that pick another model
# (a GPU model, a draft, LoRA, speculation) are cleared, whatever this make was given for REPO.
llmapi-repo: setup
	$(MAKE) --no-print-directory repo ENGINE=llmapi REPO=$(LLMAPI_REPO) HF_MODEL= DRAFT_HF_MODEL= LORA_DIR= \
	    SPECULATIVE= EAGLE_DIR=

test-llmapi: system-packages lint llmapi-repo
	$(TEST_PY) -m pytest -q tests/integration --repo $(LLMAPI_REPO)

# The fast loop. lint: ruff over the Python (pyproject.toml's [tool.ruff]), then every C++ file (relay/, the bench's
# send_cpp) compiled by g++ and clang++ with the relay's warnings as errors (tools/lint_cpp.py). unit: tests/unit
# (no server; a test that needs `make repo`'s build/assets skips, naming it; make test runs them after building).
lint: $(TEST_SETUP)
	$(TEST_PY) -m ruff check .
	$(TEST_PY) -m tools.lint_cpp

unit: $(TEST_SETUP)
	$(TEST_PY) -m pytest -q tests/unit --repo $(REPO)

# The README's container commands, as written, in a reproduction of the 26.07 image's layout on this machine
# (tools/container_rehearsal.py: what it reproduces; docs/container.md: what it cannot). Runs the default repository.
rehearse: repo system-packages
	$(PY) -m tools.container_rehearsal

# Debian packages the tests run (promtool; clang++ with its sanitizer runtime, the 26.07 image's compiler; the
# distribution's python3 venv and libpython for the rehearsal), each proven by what the tests do with it and installed
# where it fails, as root (tools/system_packages.py); elsewhere the apt-get command to run is named.
# Debian 12/13 packages it may install: g++ clang libclang-rt-dev prometheus python3 python3-venv libpythonX.Y iproute2.
system-packages:
	$(PYTHON) tools/system_packages.py

# The container's test clients: a venv of the test extra over the container Python's site-packages, which it
# shadows only inside it (testkit/client_venv.py says why it is not --system-site-packages).
$(TEST_VENV)/.installed: pyproject.toml
	$(PYTHON) -m testkit.client_venv $(TEST_VENV)
	touch $@

# Section "aiperf" runs NVIDIA's AIPerf from its own venv (the rule is with the other load tools' below); set
# before the rule, which expands it when make reads it.
AIPERF_VENV ?= build/venv-aiperf
bench: repo $(AIPERF_VENV)/.installed
	$(PY) -m tools.bench --repo $(REPO) --aiperf-venv $(AIPERF_VENV)

soak: repo
	$(PY) -m tools.soak --repo $(REPO) $(if $(DURATION),--duration $(DURATION)) $(if $(CONCURRENCY),--concurrency $(CONCURRENCY))

# The built repository as one tarball, checked against its manifest (docs/operations.md: shipping it).
dist: setup
	$(BUILD) dist --repo $(REPO)

clean:
	rm -rf build .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# ---- Triton's own load tools (each in its own venv under build/) ------------------------------------------
# PERF_URL=host:grpc_port measures a running deployment (e.g. the NGC container on a GPU box; give its
# tokenizer as PERF_TOKENIZER); empty starts a server on $(REPO) for the run.
PERF_VENV ?= build/venv-perf
GENAI_PERF_VENV ?= build/venv-genai-perf
PERF_URL ?=
PERF_MODELS ?= ensemble tensorrt_llm_bls
PERF_TOKENIZER ?= $(ASSETS)/tokenizer
PERF_CONCURRENCY ?= 4
PERF_REQUESTS ?= 40
PERF_MAX_TOKENS ?= 32
PERF_ARGS = $(if $(PERF_URL),--url $(PERF_URL)) --repo $(REPO) --models $(PERF_MODELS) \
    --concurrency $(PERF_CONCURRENCY) --requests $(PERF_REQUESTS) --max-tokens $(PERF_MAX_TOKENS) --perf-venv $(PERF_VENV)

.PHONY: perf-analyzer genai-perf gpu-bench

$(PERF_VENV)/.installed:
	$(PYTHON) -m venv $(PERF_VENV)
	$(PERF_VENV)/bin/pip install -q "tritonclient[all]==2.51.0"
	touch $@

$(GENAI_PERF_VENV)/.installed:
	$(PYTHON) -m venv $(GENAI_PERF_VENV)
	$(GENAI_PERF_VENV)/bin/pip install -q "genai-perf==0.0.16"
	touch $@

# NVIDIA's AIPerf (genai-perf's successor) for `make bench`'s section "aiperf": ~1.2 GB of dependencies (its own
# transformers, pyarrow, pandas, scipy, aiohttp, pydantic...) that must not touch the project's venv.
$(AIPERF_VENV)/.installed:
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q "aiperf==0.13.0"
	touch $@

perf-analyzer: setup $(PERF_VENV)/.installed
	$(PY) -m tools.perf_tools perf-analyzer $(PERF_ARGS)

genai-perf: setup $(PERF_VENV)/.installed $(GENAI_PERF_VENV)/.installed
	$(PY) -m tools.perf_tools genai-perf $(PERF_ARGS) --genai-venv $(GENAI_PERF_VENV) --tokenizer $(PERF_TOKENIZER)

# In the 26.07 TensorRT-LLM container, after `make repo ENGINE=trtllm`: trtllm-bench on the engine, genai-perf on
# ensemble and BLS, beside the seeds' figures (tools/gpu_bench.py). Not run in this repository's development.
gpu-bench: setup $(PERF_VENV)/.installed $(GENAI_PERF_VENV)/.installed
	$(PY) -m tools.gpu_bench --repo $(REPO) --perf-venv $(PERF_VENV) --genai-venv $(GENAI_PERF_VENV)

# ---- Kubernetes and Prometheus (docs/operations.md, "Kubernetes") ---------------------------------------------------
# make k8s: deploy/ rendered for REPO (its repository.json: GPUs = TP x PP, the serve path) into build/k8s/ and
# validated against Kubernetes' schemas. K8S_VALUES=my.yaml is merged over deploy/values.yaml; K8S_SET="a.b=c ...";
# PROMETHEUS_OPERATOR_CRDS=<the operator's example/prometheus-operator-crd> validates the PodMonitor and
# PrometheusRule against their CRDs too.
K8S_OUT ?= build/k8s
K8S_VALUES ?=
K8S_SET ?=
k8s: setup
	@test -f $(REPO)/repository.json || $(MAKE) repo
	$(PY) -m deploy.render --repo $(REPO) --out $(K8S_OUT) $(if $(K8S_VALUES),--values $(K8S_VALUES)) \
	    $(if $(K8S_SET),--set "$(K8S_SET)")

# make prometheus-check: a real Prometheus (Debian's `prometheus` package) with deploy/prometheus/rules.yaml scrapes a
# real tritonserver (and the OpenAI API) on REPO under a soak: every dashboard query must return data and the
# autoscaling signal must rise with the load and fall after it (tools/prometheus_check.py).
prometheus-check: repo
	$(PY) -m tools.prometheus_check --repo $(REPO)

# make api-image: the OpenAI API's image (deploy/api.Dockerfile), the Deployment's `api.image`. Where docker cannot
# build (no docker, no daemon) it prints the command to run elsewhere and succeeds.
API_IMAGE ?= llama3-triton-openai-api:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
API_IMAGE_BUILD := docker build -f deploy/api.Dockerfile -t $(API_IMAGE) .
api-image:
	@if docker info >/dev/null 2>&1; then \
	    echo "$(API_IMAGE_BUILD)"; DOCKER_BUILDKIT=1 $(API_IMAGE_BUILD) \
	    && echo "built $(API_IMAGE): docker push it, then set api.image (deploy/values.yaml) to it"; \
	else echo "make api-image: no usable docker daemon here; run on a machine with one, from this directory:"; \
	    echo "  DOCKER_BUILDKIT=1 $(API_IMAGE_BUILD) && docker push $(API_IMAGE)"; fi

.PHONY: k8s prometheus-check api-image
