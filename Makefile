# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
.PHONY: setup data demo test lint bench-core clean-cache
VENV := .venv/bin

setup:
	@bash scripts/bootstrap.sh

data:
	@bash scripts/ensure_fashion_mnist.sh

## The main job: every core method on Fashion-MNIST, 10 clients, Dirichlet α=0.1.
demo: setup data
	$(VENV)/oneshotfl run --config configs/demo.yaml --out runs/demo

## Lint, type-check, then the whole test suite (slow end-to-end tests included).
test: setup data
	$(VENV)/ruff check src tests
	$(VENV)/ruff format --check src tests
	$(VENV)/mypy
	$(VENV)/python -m pytest -q

## The committed core benchmark (see docs/benchmarks.md).
bench-core: setup data
	$(VENV)/oneshotfl sweep benchmarks/core-fmnist.yaml --out benchmarks/results/core-fmnist
	$(VENV)/oneshotfl report benchmarks/results/core-fmnist --out docs/figures/core-fmnist \
	  --markdown docs/benchmarks.md --section core-fmnist

clean-cache:
	rm -rf .cache/oneshotfl
