# Two entry points: `make course` opens the course, `make test` runs every test.
# Each creates .venv/ and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build used for development and CI; the package itself accepts a range.
TORCH_SPEC ?= torch==2.13.0
# Where to get it: empty means pip's default index. On Linux without a GPU, the CPU-only build
# is far smaller: make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
# Extra options for `jupyter lab` (e.g. make course JUPYTER_ARGS="--no-browser --port 8889");
# --allow-root is added when running as root (containers, Colab-like VMs).
JUPYTER_ARGS ?=

# A second environment holding Colab's package versions (tests/platforms/colab.txt), where the
# tests run every notebook and every explorer callback; torch stays $(TORCH_SPEC).
COLAB_VENV ?= .venv-colab
COLAB_PY := $(COLAB_VENV)/bin/python

.PHONY: course test test-fast lint format dist colab-env oldest-env classic-env browser-deps gpu-check clean slides voila

$(VENV)/.installed-course: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[course,measure]"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-course
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# JupyterLab at the repository root: notebooks/, exercises/ and solutions/ side by side.
course: $(VENV)/.installed-course
	$(VENV)/bin/jupyter lab $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(JUPYTER_ARGS) --ServerApp.root_dir=. notebooks/01_vram_equation.ipynb

# The sdist and the wheel of this version in dist/, built as .github/workflows/release.yml
# builds what it publishes; rebuilt when the package changes.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml | head -n 1)
WHEEL := dist/lessonkit-$(VERSION)-py3-none-any.whl
PACKAGE_FILES := pyproject.toml README.md LICENSE $(shell find lessonkit -name '*.py' -o -name '*.json')

$(WHEEL): $(VENV)/.installed-dev $(PACKAGE_FILES)
	rm -rf dist
	$(PY) -m build --outdir dist .

dist: $(WHEEL)

# Colab's packages, built once and reused until the profile or pyproject.toml changes; then
# lessonkit as students get it: the wheel (not the working tree), installed with Colab's
# versions as constraints, again whenever the wheel is rebuilt.
$(COLAB_VENV)/.installed: tests/platforms/colab.txt tests/platforms/profiles.py pyproject.toml
	rm -rf $(COLAB_VENV)
	$(PYTHON) -m venv $(COLAB_VENV)
	$(PYTHON) tests/platforms/profiles.py constraints colab > $(COLAB_VENV)/constraints.txt
	$(PYTHON) tests/platforms/profiles.py requirements > $(COLAB_VENV)/requirements.txt
	$(COLAB_PY) -m pip install -q $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) -c $(COLAB_VENV)/constraints.txt "$(TORCH_SPEC)"
	$(COLAB_PY) -m pip install -q -c $(COLAB_VENV)/constraints.txt -r $(COLAB_VENV)/requirements.txt
	$(COLAB_PY) -Xfrozen_modules=off -m ipykernel install --prefix $(COLAB_VENV) --name lessonkit-colab --display-name "Python (Colab's packages)" >/dev/null
	touch $@

$(COLAB_VENV)/.installed-wheel: $(COLAB_VENV)/.installed $(WHEEL)
	rm -f "$$($(COLAB_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/lessonkit-worktree.pth"
	$(COLAB_PY) -m pip uninstall -q -y lessonkit
	$(COLAB_PY) -m pip install -q -c $(COLAB_VENV)/constraints.txt "lessonkit[measure] @ file://$(CURDIR)/$(WHEEL)"
	touch $@

colab-env: $(COLAB_VENV)/.installed-wheel

# The oldest matplotlib and ipywidgets that pyproject.toml allows, for the chart and explorer
# tests (no torch needed there).
OLDEST_VENV ?= .venv-oldest
$(OLDEST_VENV)/.installed: tests/platforms/profiles.py pyproject.toml
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(PYTHON) tests/platforms/profiles.py lowest > $(OLDEST_VENV)/requirements.txt
	$(OLDEST_VENV)/bin/python -m pip install -q -r $(OLDEST_VENV)/requirements.txt
	echo "$(CURDIR)" > "$$($(OLDEST_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/lessonkit-worktree.pth"
	touch $@

oldest-env: $(OLDEST_VENV)/.installed

# Presenter mode (NB is a notebook number): reveal.js slides of a notebook, or a Voilà dashboard
# of its explorers. `make slides NB=01` writes artifacts/slides/01_vram_equation.slides.html.
NB ?= 01
$(VENV)/.installed-present: $(VENV)/.installed-course
	$(PY) -m pip install -q -e ".[course,measure,present]"
	touch $@

slides: $(VENV)/.installed-present
	$(PY) tools/present.py slides $(NB)

voila: $(VENV)/.installed-present
	$(PY) tools/present.py voila $(NB)

# Classic Notebook 6.5 with ipywidgets 7.7.1 and the widgetsnbextension 3.6.10 that pip installs
# with it (its Output widget stays blank), for the browser test's classic-Notebook part (no torch:
# the explorers do not need it). Without it that part is skipped, saying so;
# LESSONKIT_CLASSIC_ENV points the test at another copy.
CLASSIC_ENV ?= .venv-classic
$(CLASSIC_ENV)/.installed:
	rm -rf $(CLASSIC_ENV)
	$(PYTHON) -m venv $(CLASSIC_ENV)
	$(CLASSIC_ENV)/bin/python -m pip install -q "notebook==6.5.*" "ipywidgets==7.7.1" "widgetsnbextension==3.6.10" "matplotlib>=3.6"
	touch $@

classic-env: $(CLASSIC_ENV)/.installed

# Debian's Chromium for the browser tests (browser downloads are not used).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "Install Chromium (e.g. 'sudo apt-get install chromium') for the browser tests."; fi; \
	fi

# pytest-xdist workers for `make test` (CI has two cores); --dist loadgroup keeps the tests that
# share a fixture, and each accuracy-grid row's checks, on one worker (tests/conftest.py).
TEST_WORKERS ?= 2
test: lint $(COLAB_VENV)/.installed-wheel $(OLDEST_VENV)/.installed $(CLASSIC_ENV)/.installed browser-deps
	MPLBACKEND=Agg $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

# ruff (lint and format check: package, tests, tools, notebooks) and mypy (strict) on the package.
lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Rewrites files: ruff's safe fixes, then the formatter.
format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test-fast: $(VENV)/.installed-dev
	MPLBACKEND=Agg $(PY) -m pytest -m "not slow and not browser and not notebooks"

gpu-check: $(VENV)/.installed-dev
	$(PY) scripts/gpu_check.py

# Back to the tree a clone has: environments, caches, build output and what the tools and tests
# write (artifacts/, hypothesis's examples).
clean:
	rm -rf $(VENV) $(COLAB_VENV) $(OLDEST_VENV) $(CLASSIC_ENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist artifacts .whl *.egg-info
	find . -path ./.git -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
