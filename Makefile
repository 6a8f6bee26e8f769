# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
.PHONY: setup data demo test lint bench-core bench-fedol bench-fedol-ablation clean-cache
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

## The FedOL benchmark of issue 3 (see docs/benchmarks.md): two single-threaded shards of
## the grid run in parallel, one per core (runs are deterministic at a fixed thread count).
bench-fedol: setup data
	OMP_NUM_THREADS=1 $(VENV)/oneshotfl sweep benchmarks/fedol-fmnist.yaml \
	  --out benchmarks/results/fedol-fmnist --shard 0/2 & \
	OMP_NUM_THREADS=1 $(VENV)/oneshotfl sweep benchmarks/fedol-fmnist.yaml \
	  --out benchmarks/results/fedol-fmnist --shard 1/2; wait
	$(VENV)/oneshotfl report benchmarks/results/fedol-fmnist --out docs/figures/fedol-fmnist \
	  --markdown docs/benchmarks.md --section fedol-fmnist

## FedOL's ablation (run after bench-fedol: it reuses that sweep's cached client models).
bench-fedol-ablation: setup data
	OMP_NUM_THREADS=1 $(VENV)/oneshotfl sweep benchmarks/fedol-ablation.yaml \
	  --out benchmarks/results/fedol-ablation --shard 0/2 & \
	OMP_NUM_THREADS=1 $(VENV)/oneshotfl sweep benchmarks/fedol-ablation.yaml \
	  --out benchmarks/results/fedol-ablation --shard 1/2; wait
	$(VENV)/oneshotfl report benchmarks/results/fedol-ablation \
	  --out docs/figures/fedol-ablation --markdown docs/benchmarks.md --section fedol-ablation

clean-cache:
	rm -rf .cache/oneshotfl
