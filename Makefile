# eagle-datagen: developer entry points. `make demo` and `make test` are README's first two commands.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test bench chaos clean

$(BIN)/datagen: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch first (lies on local disk here); otherwise pip pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0 || echo "torch==2.13.0 CPU wheel not found locally; pip will pick a torch build"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/datagen

venv: $(BIN)/datagen

demo: venv
	$(BIN)/datagen run config.toml --headless

test: venv
	$(BIN)/python -m pytest -q -x --durations=10

clean:
	rm -rf $(VENV) runs
