# smolfsdp: two commands on a fresh machine.
#   make demo   run the main job (2 CPU processes, native FSDP, tiny SmolLM3, bundled medical Q&A)
#   make test   run the CPU test suite, notebooks included
#   make render render the book with Quarto (PROFILE=smoke, the default, or PROFILE=full on 2 GPUs)
# Each creates .venv with the pinned versions (constraints.txt) when it is not there.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs torch's CPU build first (a machine without
# a GPU, the book workflow): PyPI's torch for Linux is the CUDA build, several GB.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv lint book render tokenizer clean
PROFILE ?= smoke

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "[venv] installing the pinned packages (constraints.txt: torch, transformers, TRL, peft, accelerate,"
	@echo "[venv] jupyter, pytest, ...) into $(VENV): about 2-3 minutes from a local registry on an idle machine, longer from PyPI"
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet --index-url $(TORCH_INDEX) "$$(grep '^torch==' constraints.txt)")
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $(STAMP)
	@echo "[venv] ready: $(VENV)"

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/smolfsdp train --config configs/runs/smoke.yaml

# Two pytest-xdist workers: while one test runs a single CPU-bound process (a dry run, a trace analysis) the
# other core runs another file. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	@echo "[test] $(TEST_WORKERS) workers collecting the tests (each imports torch and transformers: about 20-40 s before the first dot)"
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts && $(BIN)/ruff format --check src tests scripts

# The book, rendered by Quarto from a scratch copy (_render/$(PROFILE)/, its own _freeze/), never
# over the committed notebooks; the site lands in _book/$(PROFILE)/. Needs Quarto on PATH.
# EXECUTED=DIR renders notebooks already executed into DIR (`make book EXECUTED=DIR` writes them) without
# executing them again: one execution, Quarto only renders (what the test suite does, tests/test_site.py).
render: $(STAMP)
	$(BIN)/python scripts/render_book.py --profile $(PROFILE) $(if $(EXECUTED),--executed $(EXECUTED))

# Without Quarto: execute every chapter (parameters injected as `quarto render -P` does) and write
# plain nbconvert HTML to _book_html/, what CI checks in Chromium. That HTML is not the book (no
# cross-references, captions or navigation): read the rendered site, or run `make render`.
book: $(STAMP)
	$(BIN)/python scripts/execute_notebooks.py --profile $(PROFILE) --html-dir _book_html $(if $(EXECUTED),--ipynb-dir $(EXECUTED))

tokenizer: $(STAMP)
	$(BIN)/python scripts/build_tokenizer.py

clean:
	rm -rf runs _book_html _book _render _executed .pytest_cache
