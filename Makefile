# smolfsdp: two commands on a fresh machine.
#   make demo   run the main job (2 CPU processes, native FSDP, tiny SmolLM3, bundled medical Q&A)
#   make test   run the CPU test suite, notebooks included
# Each creates .venv with the pinned versions (constraints.txt) when it is not there.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv lint book tokenizer clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/smolfsdp train --config configs/runs/smoke.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts && $(BIN)/ruff format --check src tests scripts

# Execute every chapter in the smoke profile and write HTML next to it (what CI checks in Chromium).
book: $(STAMP)
	$(BIN)/python scripts/execute_notebooks.py --html-dir _book_html

tokenizer: $(STAMP)
	$(BIN)/python scripts/build_tokenizer.py

clean:
	rm -rf runs _book_html .pytest_cache
