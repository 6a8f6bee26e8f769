# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
.PHONY: setup data demo test test-fast test-cuda docs check-site check-wheel lint bench-core bench-fedol bench-fedol-ablation bench-fedage \
	bench-fedeov bench-fedeov-target bench-fedeov-memory bench-fedeov-fgsm3 bench-intactofl bench-fol bench-fol-defaults bench-user-datasets bench-robust bench-robustness bench-robustness-full bench-robustness-floor robustness-matrix bench-small-data bench-workers bench-scale bench-scale-bookkeeping bench-scale-ensemble bench-scale-stream bench-scale-growth bench-ensemble-eval bench-gpu check-kernels bench-membership bench-fedd3-privacy bench-fens bench-stats bench-fedpft-defaults bench-stats-privacy bench-authors-stats bench-authors-fens bench-authors-fedd3 bench-authors-fedage bench-authors-fedeov bench-authors-intactofl bench-merging bench-authors-merging bench-authors-selection bench-fedcgs bench-fafi bench-fedsd2c bench-fedsd2c-privacy claims bench-flower bench-flower-deploy bench-flower-sim bench-flower-scale bench-flower-cohorts check-flower-chaos check-reproduce check-committed check-committed-avx2 \
	clean-cache
VENV := .venv/bin

setup:
	@ONESHOTFL_EXTRAS=dev,flower,docs,track,flwr-datasets,crosscheck bash scripts/bootstrap.sh

data:
	@bash scripts/ensure_fashion_mnist.sh

## The main job: every seed system (FedOL, FedAGE, FedEOV, IntactOFL, FOL) next to fedavg,
## ensemble and centralized on one Fashion-MNIST federation, then its table and plots.
demo: setup data
	@start=$$(date +%s); rm -rf runs/demo \
	  && $(VENV)/oneshotfl run --config configs/demo.yaml --out runs/demo --report runs/demo/report \
	  && echo "demo: table runs/demo/methods.csv; partition heatmap runs/demo/partition.png;" \
	    "accuracy vs upload bytes runs/demo/report/accuracy_vs_bytes.png" \
	    "(personal accuracy: runs/demo/report/personal_accuracy_vs_bytes.png)" \
	  && echo "demo: $$(( $$(date +%s) - start )) s after set-up"

## The whole test suite (one pytest worker per core; it builds the docs site strictly too; on
## the CPU whatever the machine has: GPUs are hidden, `make test-cuda` checks them), lint +
## type-check beside it, and after both Flower on loopback: scripts/flower_e2e.sh, one
## SuperLink with TLS + node auth and its SuperNodes, every scenario on them (the methods
## against the local simulation, FOL on a ring, bad nodes, the node binding and a node's own
## data, an unregistered node, then the faults: garbage, a frozen node, a node killed at work,
## the quorum, a SuperLink restart, its state lost; `make check-flower-chaos` is the 50-node
## lane of the faults). It runs alone: SuperLinks, SuperNodes and app processes on two cores
## shared with two pytest workers ran a tiny run 70x slower than alone. Logs go to
## runs/lint.log and runs/flower-e2e.log and are printed after pytest's, so the end of the
## output says how all three went, and how long each phase took.
E2E_LOG := runs/flower-e2e.log
LINT_LOG := runs/lint.log
LINT = $(VENV)/ruff check src tests examples scripts \
	&& $(VENV)/ruff format --check src tests examples scripts \
	&& $(VENV)/mypy
# the shell steps both test targets share: pytest (one worker per core) with lint and
# type-check beside it, their exit statuses in $$tests and $$lint, the lint log printed after
PYTEST_WITH_LINT = ( $(LINT) ) >$(LINT_LOG) 2>&1 & lint=$$!; \
	  CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 $(VENV)/python -m pytest -q -n auto; tests=$$?; \
	  wait $$lint; lint=$$?; echo "--- lint and type-check ($(LINT_LOG))"; cat $(LINT_LOG)
test: setup data
	@echo "pytest with lint beside it ($(LINT_LOG)), then Flower end to end and under faults ($(E2E_LOG))"
	@mkdir -p runs; t0=$$(date +%s); $(PYTEST_WITH_LINT); t1=$$(date +%s); \
	  CUDA_VISIBLE_DEVICES= bash scripts/flower_e2e.sh >$(E2E_LOG) 2>&1; flower=$$?; t2=$$(date +%s); \
	  echo "--- Flower end to end and under faults ($(E2E_LOG))"; cat $(E2E_LOG); \
	  test $$flower -eq 0 || grep "FAILED" $(E2E_LOG) | tail -n 5; \
	  echo "pytest: exit $$tests; lint: exit $$lint; Flower end to end: exit $$flower"; \
	  echo "seconds: pytest with lint beside it $$((t1 - t0)), Flower end to end $$((t2 - t1))"; \
	  test $$tests -eq 0 && test $$lint -eq 0 && test $$flower -eq 0

## The inner loop: the test suite with lint and type-check beside it (as `make test`), without
## the Flower end-to-end script.
test-fast: setup data
	@mkdir -p runs; $(PYTEST_WITH_LINT); \
	  echo "pytest: exit $$tests; lint: exit $$lint"; test $$tests -eq 0 && test $$lint -eq 0

## The GPU's own check (issue 34), for a machine with a CUDA device: the demo's config and
## every registered method at tiny budgets on it. `make test` hides GPUs (CUDA_VISIBLE_DEVICES
## empty), so that it runs the same on every machine; this target is where a GPU is used.
test-cuda: setup data
	OMP_NUM_THREADS=1 $(VENV)/python -m pytest -q tests/test_cuda.py

lint: setup data
	$(LINT)

## The documentation site (mkdocs.yml) into site/; --strict: a broken link or reference fails.
## Open site/index.html from disk, or serve it: python -m http.server -d site.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict --site-dir site

## The site in headless Chromium (apt-get install chromium): builds it, then opens every page of
## the navigation from disk and served on localhost, searches, and counts tables that scroll
## sideways; writes benchmarks/results/docs/site-check.txt.
check-site: setup
	$(VENV)/python scripts/check_site.py

## Packaging (issue 16): build the wheel; install it into clean venvs without extras and with
## the flower extra; `oneshotfl --version`, a tiny digits run, `import oneshotfl.flower.app`.
check-wheel:
	bash scripts/check_wheel.sh

## The committed core benchmark (docs/benchmarks/core.md).
bench-core: setup data
	$(VENV)/oneshotfl sweep benchmarks/core-fmnist.yaml --out benchmarks/results/core-fmnist
	$(VENV)/oneshotfl report benchmarks/results/core-fmnist --out docs/figures/core-fmnist \
	  --markdown docs/benchmarks/core.md --section core-fmnist

## The merging benchmark of issue 43 (docs/benchmarks/merging.md): FedFisher and RegMean on the
## core benchmark's federations, two single-threaded shards.
bench-merging: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh merging-fmnist merging-clients
	$(VENV)/python scripts/paired.py methods benchmarks/results/merging-fmnist $(MERGING_PAIRS) \
	  > benchmarks/results/merging-fmnist/paired-readings.md

## The readings the merging page compares, paired seed by seed (scripts/paired.py).
MERGING_PAIRS := "fedfisher - fedavg" "fedfisher:solver=closed - fedfisher" "regmean - fedavg" \
  "regmean:others=weighted - regmean" "regmean:alpha=0.1 - regmean" \
  "regmean:others=weighted - ensemble" "fedfisher:curvature=kfac - fedfisher" \
  "fedfisher:curvature=kfac - ensemble" "fedlpa - fedavg" "fedlpa:solver=approx - fedlpa" \
  "fedlpa:solver=gd - fedlpa" "fedd3 - ensemble" "fedd3:images=100 - ensemble" \
  "fedd3 - fedd3:threshold=1.01" "fedd3 - fedd3:distill=gmm"

## FENS's aggregator rounds beside the ensembles, and over client count (docs/benchmarks/merging.md).
bench-fens: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fens-fmnist fens-clients
	$(VENV)/python scripts/paired.py methods benchmarks/results/fens-fmnist "fens - ensemble" \
	  "fens:aggregator=linear - ensemble" "fens:proxy=train - fens" \
	  > benchmarks/results/fens-fmnist/paired-readings.md

## GH-OFL's and FedPFT's class statistics of the shared encoder, and over client count
## (docs/benchmarks/merging.md).
bench-stats: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh stats-fmnist stats-clients
	$(VENV)/python scripts/paired.py methods benchmarks/results/stats-fmnist \
	  "ghofl - centralized_head" "ghofl - head_ensemble" "ghofl - head_avg" \
	  "ghofl:head=qda - ghofl" "ghofl:head=nb - ghofl" "fedpft:components=3 - fedpft" \
	  "fedpft:covariance=diag - fedpft" "fedpft:components=3 - ghofl" \
	  > benchmarks/results/stats-fmnist/paired-readings.md

## FedPFT's lr and step floor against the baseline's, on five seeds (issue 51;
## docs/benchmarks/merging.md): benchmarks/fedpft-defaults.yaml, two single-threaded shards.
bench-fedpft-defaults: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fedpft-defaults

## $(call need_checkouts,VARS,SWEEPS): stop in one line unless every VAR names a checkout of the
## authors' code (the benchmarks/authors/ plugins read them).
define need_checkouts
	@missing=""; for v in $(1); do [ -n "$$(printenv $$v)" ] || missing="$$missing $$v"; done; \
	  [ -z "$$missing" ] || { echo "$@: expected$$missing naming checkouts of the authors' code ($(2)), got none"; exit 2; }
endef

## The authors' server steps of GH-OFL and FedPFT as plugins on the same shared-encoder clients
## (seeds 0-4; docs/benchmarks/merging.md); GHOFL_REPO and FEDPFT_REPO name checkouts.
bench-authors-stats: setup data
	$(call need_checkouts,GHOFL_REPO FEDPFT_REPO,benchmarks/authors-stats.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-stats

## The authors' FENS server step (FedAdam on SmallNN) as a plugin on the same FENS clients (seeds
## 0-4; docs/benchmarks/merging.md); FENS_REPO names a checkout of their code.
bench-authors-fens: setup data
	$(call need_checkouts,FENS_REPO,benchmarks/authors-fens.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-fens

## The authors' FedD3 server step (their FedServer.train, on our cnn) as a plugin on the same
## FedD3 clients (seeds 0-4; docs/benchmarks/merging.md); FEDD3_REPO names a checkout of their code.
bench-authors-fedd3: setup data
	$(call need_checkouts,FEDD3_REPO,benchmarks/authors-fedd3.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-fedd3

## What GH-OFL's and FedPFT's class means reveal, inverted through the encoder (merging.md).
bench-stats-privacy: setup data
	OMP_NUM_THREADS=1 $(VENV)/python scripts/stats_privacy.py benchmarks/stats-privacy.yaml

## What FedD3's distilled examples reveal of each client's data (docs/benchmarks/merging.md).
bench-fedd3-privacy: setup data
	OMP_NUM_THREADS=1 $(VENV)/python scripts/fedd3_privacy.py benchmarks/fedd3-privacy.yaml

## The authors' server steps of FedFisher and FedLPA as plugins on the same clients (seeds 0-4),
## then FedLPA's, theirs and ours, on factors in their K-FAC scaling (benchmarks/authors-fedlpa.yaml),
## then per layer where the descent is stable and the factor ablation on the merging table's
## clients, seeds 0-2 (scripts/fedlpa_stability.py; docs/benchmarks/merging.md); FEDFISHER_REPO and FEDLPA_REPO name checkouts of their code.
bench-authors-merging: setup data
	$(call need_checkouts,FEDFISHER_REPO FEDLPA_REPO,benchmarks/authors-merging.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-merging authors-fedlpa
	OMP_NUM_THREADS=2 $(VENV)/python scripts/fedlpa_stability.py benchmarks/merging-fmnist.yaml

## FedCGS beside GH-OFL and the authors' server step on the shared-encoder federations, over α and
## client count (issue 52; docs/benchmarks/merging.md); FEDCGS_REPO names a checkout.
bench-fedcgs: setup data
	$(call need_checkouts,FEDCGS_REPO,benchmarks/fedcgs-fmnist.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh fedcgs-fmnist
	$(VENV)/python scripts/paired.py methods benchmarks/results/fedcgs-fmnist \
	  "fedcgs - ghofl" "fedcgs - fedcgs_authors" "fedcgs - head_ensemble" \
	  > benchmarks/results/fedcgs-fmnist/paired-readings.md
	$(VENV)/python scripts/paired.py times benchmarks/results/fedcgs-fmnist --step server \
	  "fedcgs / fedcgs_authors" > benchmarks/results/fedcgs-fmnist/times.md

## FAFI beside the ensemble, FedAvg and the authors' server step on the core federations and at 5
## and 20 clients (fafi-clients), then the authors' client step on the same federations
## (authors-fafi; issue 52;
## docs/benchmarks/merging.md); FAFI_REPO names a checkout.
bench-fafi: setup data
	$(call need_checkouts,FAFI_REPO,benchmarks/fafi-fmnist.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh fafi-fmnist fafi-clients
	$(VENV)/python scripts/paired.py methods benchmarks/results/fafi-fmnist \
	  "fafi - ensemble" "fafi - fedavg" "fafi - fafi_authors" "fafi:draw=image - fafi" \
	  > benchmarks/results/fafi-fmnist/paired-readings.md
	$(VENV)/python scripts/paired.py times benchmarks/results/fafi-fmnist --step server \
	  "fafi / fafi_authors" > benchmarks/results/fafi-fmnist/times.md
	$(VENV)/python scripts/paired.py methods benchmarks/results/fafi-clients \
	  "fafi - ensemble" "fafi - fedavg" "fafi - fafi_authors" \
	  > benchmarks/results/fafi-clients/paired-readings.md
	$(VENV)/python scripts/paired.py times benchmarks/results/fafi-clients --step server \
	  "fafi / fafi_authors" > benchmarks/results/fafi-clients/times.md
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-fafi
	$(VENV)/python scripts/paired.py methods benchmarks/results/authors-fafi \
	  "fafi_authors_client - fafi" "fafi_authors_client - ensemble" \
	  > benchmarks/results/authors-fafi/paired-readings.md

## FedSD2C beside the ensemble, FedAvg, FedD3 and the authors' client and server steps, then both
## server steps timed without their per-epoch test evaluation (fedsd2c-server-times; issue 52;
## docs/benchmarks/merging.md); FEDSD2C_REPO names a checkout.
bench-fedsd2c: setup data
	$(call need_checkouts,FEDSD2C_REPO,benchmarks/fedsd2c-fmnist.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh fedsd2c-fmnist
	$(VENV)/python scripts/paired.py methods benchmarks/results/fedsd2c-fmnist \
	  "fedsd2c:ipc=10 - ensemble" "fedsd2c:ipc=10 - fedd3" \
	  "fedsd2c:ipc=10:small_classes=drop - fedsd2c_authors:ipc=10" \
	  "fedsd2c:ipc=10 - fedsd2c:ipc=10:small_classes=drop" \
	  "fedsd2c:ipc=10 - fedsd2c:fourier=false:ipc=10" "fedsd2c:ipc=10 - fedsd2c:ipc=10:labels=hard" \
	  > benchmarks/results/fedsd2c-fmnist/paired-readings.md
	$(VENV)/python scripts/paired.py times benchmarks/results/fedsd2c-fmnist --step client \
	  "fedsd2c:ipc=10:small_classes=drop / fedsd2c_authors:ipc=10" \
	  > benchmarks/results/fedsd2c-fmnist/times.md
	REPORT=0 VENV=$(VENV) bash scripts/sweep_shards.sh fedsd2c-server-times
	$(VENV)/python scripts/paired.py times benchmarks/results/fedsd2c-server-times --step server \
	  "fedsd2c:ipc=10:small_classes=drop / fedsd2c_authors:ipc=10" \
	  > benchmarks/results/fedsd2c-server-times/times.md

## What FedSD2C's decoded distillates reveal of each client's images, with its two controls
## (scripts/fedd3_privacy.py; docs/benchmarks/merging.md).
bench-fedsd2c-privacy: setup data
	OMP_NUM_THREADS=1 $(VENV)/python scripts/fedd3_privacy.py benchmarks/fedsd2c-privacy.yaml

## The authors' DeDES selection and RegMean merge (FedFisher's algs/regmean.py) as plugins on the
## same clients as bench-dedes / bench-merging (benchmarks/authors-dedes.yaml, authors-regmean.yaml).
bench-authors-selection: setup data
	$(call need_checkouts,DEDES_REPO FEDFISHER_REPO,benchmarks/authors-dedes.yaml and authors-regmean.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-dedes authors-regmean
	$(VENV)/python scripts/paired.py methods benchmarks/results/authors-regmean \
	  "regmean - regmean_authors" "regmean:alpha=0.1 - regmean_authors:alpha=0.1" \
	  > benchmarks/results/authors-regmean/paired-readings.md
	$(VENV)/python scripts/paired.py times benchmarks/results/authors-regmean --step server \
	  "regmean / regmean_authors" > benchmarks/results/authors-regmean/times.md

## The authors' FedAGE (their pipeline.py client and server lines, unedited) as a plugin on the
## clients of bench-fedage (seeds 0-4; docs/benchmarks/shared-encoder.md), ours beside theirs:
## accuracy paired by seed, seconds as ratios (scripts/paired.py); FEDAGE_REPO names a checkout.
bench-authors-fedage: setup data
	$(call need_checkouts,FEDAGE_REPO,benchmarks/authors-fedage.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-fedage
	$(VENV)/python scripts/paired.py methods benchmarks/results/authors-fedage \
	  "fedage - fedage_authors" > benchmarks/results/authors-fedage/paired-readings.md
	$(VENV)/python scripts/paired.py times benchmarks/results/authors-fedage \
	  "fedage / fedage_authors" > benchmarks/results/authors-fedage/times.md  # client and server

## The FedEOV authors' negatives and vote as plugins on our FedEOV/FedOV clients
## (n = 10, disjoint, seeds 0-4; docs/benchmarks/open-set.md); FEDEOV_REPO names a checkout.
bench-authors-fedeov: setup data
	$(call need_checkouts,FEDEOV_REPO,benchmarks/authors-fedeov.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-fedeov

## The authors' IntactOFL server step (their generator, MoE gate and loop, unedited) as a plugin on
## the clients of bench-intactofl's mixed group, seeds 0-4 (benchmarks/authors-intactofl.yaml).
bench-authors-intactofl: setup data
	$(call need_checkouts,INTACTOFL_REPO,benchmarks/authors-intactofl.yaml)
	VENV=$(VENV) bash scripts/sweep_shards.sh authors-intactofl

## The seed papers' headline claims against the committed results (docs/benchmarks/claims.md).
claims: setup
	$(VENV)/python scripts/claims_report.py benchmarks/claims.yaml

## DeDES on the same federations with validation splits (docs/benchmarks/merging.md).
bench-dedes: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh dedes-fmnist dedes-clients
	$(VENV)/python scripts/paired.py methods benchmarks/results/dedes-fmnist "dedes - ensemble" \
	  "dedes:vote=soft - dedes" "dedes - ensemble:weighting=size" \
	  "dedes:vote=soft - ensemble:weighting=size" > benchmarks/results/dedes-fmnist/paired-readings.md

## The FedOL benchmark of issue 3 (docs/benchmarks/prediction-sharing.md): two single-threaded
## shards of the grid run in parallel, one per core (runs are deterministic at a fixed thread
## count).
bench-fedol: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fedol-fmnist

## FedOL's ablation (run after bench-fedol: it reuses that sweep's cached client models).
bench-fedol-ablation: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fedol-ablation

## The FedAGE benchmark of issue 4 (docs/benchmarks/shared-encoder.md): linear probes of the SimCLR
## encoder (pretrained without labels on each seed's public pool, cached) and of the random
## control, the client cost in FLOPs, then the three sweeps and their reports.
FEDAGE_DATA := max_train=20000 public_size=5000
bench-fedage: setup data
	for s in 0 1 2; do for e in simclr random; do \
	  $(VENV)/oneshotfl encoder probe --encoder $$e $(FEDAGE_DATA) seed=$$s \
	    --out benchmarks/results/encoder-probes/$$e-seed$$s.json || exit 1; \
	done; done
	$(VENV)/oneshotfl encoder cost --encoder simclr --full cnn --full mlp \
	  --backbone resnet18@224 --out docs/figures/fedage-cost $(FEDAGE_DATA)
	for e in identity simclr; do \
	  $(VENV)/oneshotfl encoder attack --encoder $$e --epsilons none,16,4,1 \
	    --out docs/figures/fedage-attack-$$e $(FEDAGE_DATA) || exit 1; \
	done
	VENV=$(VENV) bash scripts/sweep_shards.sh fedage-fmnist fedage-clients fedage-knobs fedage-upper

## The FedEOV benchmark of issue 12 (docs/benchmarks/open-set.md): the Table 6 analogue, the label-
## and feature-skew tables and the stage ablation, two single-threaded shards each. The
## ablation runs after fedeov-fmnist, whose n = 10 client models it reuses from the cache.
bench-fedeov: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fedeov-fmnist fedeov-votes fedeov-ablation fedeov-skews
	$(VENV)/python scripts/fedeov_report.py latency

## FedEOV's wall-time target (issue 12): one timed process with both cores (2 threads), no
## cache, on an otherwise idle machine; compare with the reference's 24.6 min.
bench-fedeov-target: setup data
	OMP_NUM_THREADS=2 $(VENV)/oneshotfl sweep benchmarks/fedeov-target.yaml \
	  --out benchmarks/results/fedeov-target
	$(VENV)/oneshotfl report benchmarks/results/fedeov-target \
	  --out docs/figures/fedeov-target --markdown docs/benchmarks/open-set.md \
	  --section fedeov-target
	$(VENV)/python scripts/fedeov_report.py target

## Peak memory of FedEOV on the target federation (issue 27): one process, nothing cached.
bench-fedeov-memory: setup data
	$(VENV)/python scripts/peak_memory.py benchmarks/fedeov-memory.yaml

## FedEOV's three-step FGSM against the 15-step default (issue 27), on the Table 6 federations.
bench-fedeov-fgsm3: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fedeov-fgsm3
	$(VENV)/python scripts/fedeov_report.py fgsm3

## The IntactOFL benchmark of issue 13 (docs/benchmarks/data-free.md): the α table (parameter
## methods on 10 resnet8 clients, MoE and data-free KD on a cnn/mlp/resnet8/vgg mix), the generator
## and gate ablation (reuses the α = 0.5 mixed clients), the clients table; two shards each.
bench-intactofl: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh intactofl-fmnist intactofl-ablation intactofl-clients

## FOL's Tables 1/2 analogue of issue 14 (docs/benchmarks/personalisation.md): the server-free
## methods over ψ, two graphs and E = 1..3, the global references on the same federations, the stage
## ablation; two shards each, then the hand-made tables (per client, mean ± std, bytes, cost).
bench-fol: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh fol-fmnist fol-references fol-ablation
	$(VENV)/python scripts/fol_report.py

## FOL against local at the library's defaults (issue 36; docs/benchmarks/personalisation.md):
## digits, a Fashion-MNIST subset and the breast-cancer table with and without the step floor,
## and full Fashion-MNIST, five seeds (each run's wall time in its result.json).
bench-fol-defaults: setup data
	$(VENV)/python scripts/make_user_datasets.py runs/data/user
	REPORT=0 VENV=$(VENV) bash scripts/sweep_shards.sh fol-defaults fol-defaults-fmnist
	$(VENV)/python scripts/fol_defaults_report.py

## Every registered method on four datasets a user brings (issue 36): the breast-cancer table as
## CSV, a make_classification npz table, a 32×32 RGB image folder, 20×28 grey images in an npz;
## two datasets per core, then benchmarks/results/user-datasets/summary.md (recorded wall
## times: 33 min single-threaded in all, the gratings run 19 min).
bench-user-datasets: setup
	$(VENV)/python scripts/make_user_datasets.py runs/data/user
	OMP_NUM_THREADS=1 $(VENV)/python scripts/user_datasets.py \
	  --only breast-cancer-csv,gratings32-folder & first=$$!; \
	  OMP_NUM_THREADS=1 $(VENV)/python scripts/user_datasets.py \
	  --only classification-npz,grey20x28-npz; rc=$$?; wait $$first && test $$rc -eq 0
	$(VENV)/python scripts/user_datasets.py --summary

## The robust-aggregation benchmark of issue 15 (docs/benchmarks/security.md): 0–3 malicious clients
## of each attack against each method with and without its robust mode.
bench-robust: setup data
	VENV=$(VENV) bash scripts/sweep_shards.sh robust-models robust-predictions
	$(VENV)/python scripts/robust_report.py

## Clients in parallel (issue 27): one federation at 1 and 2 worker processes, no cache, on an
## otherwise idle machine; identical results, speedup, Amdahl's serial fraction.
bench-workers: setup data
	$(VENV)/python scripts/bench_workers.py

## Other CPUs on this one (issue 34): the example and the suite with torch, oneDNN and MKL
## held to AVX2 and to no SIMD (benchmarks/results/kernels/).
check-kernels: setup data
	bash scripts/check_other_kernels.sh --suite

## What a GPU pays (issue 34; needs a CUDA device): the demo on this machine's CPUs and on its
## GPU (one process, then four clients in flight), and a 100-client Fashion-MNIST federation
## of every seed system on the GPU; writes benchmarks/results/gpu/<gpu>.json.
## What a run costs as one dataset is split over 10 … 10,000 clients (issue 41,
## docs/benchmarks/scale.md): benchmarks/scale.yaml, before and after, back to back.
bench-scale: setup data
	$(VENV)/python scripts/bench_scale.py benchmarks/scale.yaml
	$(VENV)/python scripts/bench_client_batch.py cpu
	OMP_NUM_THREADS=1 $(VENV)/oneshotfl sweep benchmarks/floor-bound.yaml --out benchmarks/results/floor-bound
	$(VENV)/oneshotfl report benchmarks/results/floor-bound
	$(VENV)/python scripts/paired.py settings benchmarks/results/floor-bound local_floor_epochs 0 50 \
	  > benchmarks/results/floor-bound/paired-floor.md

## Issue 53's bookkeeping benchmark (docs/benchmarks/scale.md, "A client costs its compute"):
## fedavg at 100, 1,000 and 10,000 clients on this tree and the tree before the issue, back to
## back, on an idle machine (about 15 minutes on 2 cores).
bench-scale-bookkeeping: setup data
	$(VENV)/python scripts/bench_scale.py benchmarks/scale-bookkeeping.yaml

## Issue 53, item 3 (docs/benchmarks/scale.md, "Ensembles at the speed of their members"): an
## ensemble's evaluation against its members' forward passes alone, in one process; then the
## ensemble's whole run at 10 and 100 clients on this tree and the one before. Idle machine.
bench-ensemble-eval: setup data
	OMP_NUM_THREADS=1 $(VENV)/python scripts/bench_ensemble_eval.py

bench-scale-ensemble: setup data
	$(VENV)/python scripts/bench_scale.py benchmarks/scale-ensemble.yaml

## Streaming aggregation (issue 53, item 2): FedAvg at 1,000 and 10,000 clients folded as the
## payloads arrive against every payload held, on this tree, and `oneshotfl compare` of each pair.
bench-scale-stream: setup data
	$(VENV)/python scripts/bench_scale.py benchmarks/scale-stream.yaml
	$(VENV)/python scripts/profile_growth.py benchmarks/scale-stream.yaml

## Only the profiles of bench-scale-stream: where 1,000 clients spend more than 100.
bench-scale-growth: setup data
	$(VENV)/python scripts/profile_growth.py benchmarks/scale-stream.yaml
	for n in 1000 10000; do \
	  $(VENV)/oneshotfl compare benchmarks/results/scale-stream/fedavg-held-n$$n-after \
	    benchmarks/results/scale-stream/fedavg-folded-n$$n-after \
	    > benchmarks/results/scale-stream/compare-n$$n.txt || exit 1; \
	done

bench-gpu: setup data
	$(VENV)/python scripts/bench_gpu.py

## The small-data study of issue 26 (docs/benchmarks/robustness.md): the initialisation and the step
## floors on and off, on digits with each small model and both optimisers; two shards.
bench-small-data: setup data
	$(VENV)/python scripts/make_shapes.py runs/data/shapes16.npz
	VENV=$(VENV) REPORT=0 bash scripts/sweep_shards.sh small-data
	$(VENV)/python scripts/small_data_report.py

## The robustness matrix of issue 26 (docs/benchmarks/robustness.md): every registered method on
## digits, a Fashion-MNIST subset and our synthetic shapes16 (scripts/make_shapes.py) × cnn, mlp,
## simple_cnn2 × IID, Dirichlet 0.1, disjoint; two single-threaded processes claiming grid points,
## then the reading, which fails for a cell below `local` or `ensemble` that no documented known
## limit covers. bench-robustness runs the matrix's cut budgets (under an hour on two cores);
## bench-robustness-full the library's default budgets (about two hours).
bench-robustness: setup data
	@$(MAKE) --no-print-directory robustness-matrix MATRIX=robustness \
	  REPORT_ARGS="--against benchmarks/results/robustness-full"
bench-robustness-full: setup data
	@$(MAKE) --no-print-directory robustness-matrix MATRIX=robustness-full
robustness-matrix:
	$(VENV)/python scripts/make_shapes.py runs/data/shapes16.npz
	VENV=$(VENV) REPORT=0 bash scripts/sweep_shards.sh $(MATRIX)
	$(VENV)/python scripts/robustness_report.py benchmarks/results/$(MATRIX) --check $(REPORT_ARGS)
## How low the matrix's client budget may go: its hardest open-set cell at 150 and 200 steps.
bench-robustness-floor: setup data
	$(VENV)/python scripts/make_shapes.py runs/data/shapes16.npz
	VENV=$(VENV) REPORT=0 bash scripts/sweep_shards.sh robustness-floor

## The membership-inference audit of issue 15 (docs/benchmarks/security.md): loss-threshold,
## shadow-model and nearest-latent attacks against each upload kind; AUC and TPR at 1% FPR.
bench-membership: setup data
	OMP_NUM_THREADS=1 $(VENV)/python scripts/membership_audit.py benchmarks/membership.yaml

## The Flower figures of issue 5 (docs/benchmarks/flower.md): bytes on the wire and wall time per
## method through 3 SuperNodes against the local simulation, then Flower's simulation engine at
## 10/50/100 clients against the local run at 1 thread (results must be identical; no cache,
## so both sides train every client).
FLOWER_OUT := benchmarks/results/flower
FLOWER_BYTES := dataset=fashion_mnist clients=3 model=cnn local_epochs=1 max_train=6000 \
  local_steps=0 server_steps=0 init=torch \
  public_size=1000 server_model=cnn server_epochs=1 device=cpu
FLOWER_SIM := dataset=fashion_mnist model=cnn local_epochs=1 local_steps=0 init=torch methods=fedavg \
  device=cpu cache_dir=
bench-flower: bench-flower-deploy bench-flower-sim
	$(VENV)/python scripts/flower_report.py $(FLOWER_OUT) docs/benchmarks/flower.md

bench-flower-deploy: setup data
	mkdir -p $(FLOWER_OUT)
	bash scripts/flower_measure.sh "$(FLOWER_BYTES)" local fedavg ensemble centralized fedhkt \
	  > $(FLOWER_OUT)/deployment.jsonl

bench-flower-sim: setup data
	mkdir -p $(FLOWER_OUT)
	rm -f $(FLOWER_OUT)/simulation.jsonl $(FLOWER_OUT)/local.jsonl
	for n in 10 50 100; do \
	  rm -rf runs/flower-sim-$$n runs/local-sim-$$n; \
	  bash scripts/flower_simulation.sh $$n "$(FLOWER_SIM)" $$PWD/runs/flower-sim-$$n \
	    >> $(FLOWER_OUT)/simulation.jsonl || exit 1; \
	  OMP_NUM_THREADS=1 /usr/bin/time -f '{"clients": '$$n', "local_wall_s": %e, "local_peak_rss_kib": %M}' \
	    -a -o $(FLOWER_OUT)/local.jsonl \
	    $(VENV)/oneshotfl run $(FLOWER_SIM) clients=$$n --out runs/local-sim-$$n || exit 1; \
	  $(VENV)/oneshotfl compare runs/local-sim-$$n/result.json \
	    runs/flower-sim-$$n/result.json || exit 1; \
	done

## Flower's simulation engine past one machine (issue 42, docs/benchmarks/flower.md): 10, 100
## and 1,000 virtual clients (and 1,000 with one Ray worker), and 100 on a two-node Ray
## cluster started on this host, each against the local run at one thread measured back to
## back (peak PSS and summed RSS of the whole process tree; results must be identical).
## Then bench-flower-cohorts. About 30 minutes on 2 cores; run it on an otherwise idle machine.
FLOWER_SCALE_OUT := benchmarks/results/flower-scale
bench-flower-scale: setup data
	bash scripts/bench_flower_scale.sh $(FLOWER_SCALE_OUT) "$(FLOWER_SIM)"
	$(VENV)/python scripts/flower_scale_report.py $(FLOWER_SCALE_OUT) docs/benchmarks/flower.md
	$(MAKE) bench-flower-cohorts

## Cohorts (issue 53, src/oneshotfl/flower/cohort.py): 1,000 virtual clients one per message
## and in cohorts of 10 and 100 on one machine, 100 one per message and in cohorts of 10 on the
## two-node Ray cluster, each against the local run measured in the same script (results must
## be identical). About 12 minutes on 2 cores; run it on an otherwise idle machine.
FLOWER_COHORTS_OUT := benchmarks/results/flower-scale/cohorts
bench-flower-cohorts: setup data
	bash scripts/bench_flower_scale.sh $(FLOWER_COHORTS_OUT) "$(FLOWER_SIM)" \
	  1000 cohort:10:1000 cohort:100:1000 cluster:100 cluster-cohort:10:100
	$(VENV)/python scripts/flower_scale_report.py $(FLOWER_COHORTS_OUT) docs/benchmarks/flower.md \
	  flower-cohorts

## A Flower deployment under faults (issue 42, docs/deploy.md "Faults at scale"): CHAOS_NODES
## SuperNodes (default 50) with TLS and node auth; garbage, a frozen node and a killed node
## under the quorum rule, the quorum enforced, a SuperLink restart, its state lost. Each
## instruction starts a ClientApp (a torch process, about 0.5 GB) on its node; at most
## CHAOS_IN_FLIGHT (default 8) are out at once.
check-flower-chaos: setup data
	bash scripts/flower_chaos.sh

## Before/after check of a change to the core: the committed benchmark sweeps (SWEEP@SEEDS
## runs only those seeds) run with the code of BASE and of AFTER, each in a clean worktree with
## its own cache as two 1-thread shards; then every result of one is compared with the other
## field by field (metrics, bytes, clients, local accuracies). CHANGED names methods whose
## results are meant to differ (listed apart). The comparisons land in
## benchmarks/results/reproduce/. The defaults are issue 10's check: BASE is the last commit
## before the core reshape, AFTER its last commit (a later AFTER, e.g. HEAD, must also list
## fedage in CHANGED: issue 11 changed FedAGE's default). About 3 hours on 2 cores.
BASE ?= 6b29115
AFTER ?= a62f1c9
REPRODUCE ?= core-fmnist fedol-fmnist@0 fedol-ablation@0 fedage-knobs@0 fedage-fmnist@0 \
  fedage-clients@0
CHANGED ?= fedcvae
check-reproduce: setup data
	bash scripts/sweeps_at.sh $(BASE) runs/reproduce/before $(REPRODUCE)
	bash scripts/sweeps_at.sh $(AFTER) runs/reproduce/after $(REPRODUCE)
	mkdir -p benchmarks/results/reproduce
	for s in $(REPRODUCE); do s=$${s%@*}; \
	  $(VENV)/oneshotfl compare runs/reproduce/before/$$s runs/reproduce/after/$$s \
	    $(foreach m,$(CHANGED),--changed $(m)) \
	    --out benchmarks/results/reproduce/$$s.json || exit 1; \
	done
	$(VENV)/python scripts/reproduce_report.py

## The committed FedOL table against the BASE code on this machine (all seeds, about 2 hours).
check-committed: setup data
	bash scripts/sweeps_at.sh $(BASE) runs/reproduce/base-full fedol-fmnist
	$(VENV)/oneshotfl compare benchmarks/results/fedol-fmnist runs/reproduce/base-full/fedol-fmnist \
	  --out benchmarks/results/reproduce/committed-vs-base-fedol-fmnist.json
	$(VENV)/python scripts/reproduce_report.py

## The committed FedOL table's seed 0 at this code under the AVX2 kernels it was recorded on
## (issue 35; about 45 minutes on 2 cores), and the one row that differs rerun at BASE and at
## HEAD under the same kernels (its config: benchmarks/results/reproduce/issue35-fedavg-rounds).
AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
RESHAPE_BASE ?= cb9787b
check-committed-avx2: setup data
	$(AVX2) bash scripts/sweeps_at.sh HEAD runs/reproduce/avx2 fedol-fmnist@0
	rm -rf runs/reproduce/avx2/committed && mkdir -p runs/reproduce/avx2/committed
	for r in runs/reproduce/avx2/fedol-fmnist/*/; do \
	  cp -r benchmarks/results/fedol-fmnist/$$(basename $$r) runs/reproduce/avx2/committed/; done
	-$(VENV)/oneshotfl compare runs/reproduce/avx2/committed runs/reproduce/avx2/fedol-fmnist \
	  --out benchmarks/results/reproduce/committed-vs-head-avx2-fedol-fmnist-seed0.json
	rm -rf runs/reproduce/fr && mkdir -p runs/reproduce/fr
	[ -d runs/reproduce/fr-base ] || git worktree add --detach runs/reproduce/fr-base $(RESHAPE_BASE)
	cd runs/reproduce/fr-base && $(AVX2) OMP_NUM_THREADS=1 PYTHONPATH=$$PWD/src $(CURDIR)/$(VENV)/python \
	  -m oneshotfl run --config $(CURDIR)/benchmarks/results/reproduce/issue35-fedavg-rounds/config.yaml \
	  cache_dir=$(CURDIR)/runs/reproduce/fr/cache-before --out $(CURDIR)/runs/reproduce/fr/before
	$(AVX2) OMP_NUM_THREADS=1 $(VENV)/oneshotfl run \
	  --config benchmarks/results/reproduce/issue35-fedavg-rounds/config.yaml \
	  cache_dir=runs/reproduce/fr/cache-after --out runs/reproduce/fr/after
	$(VENV)/oneshotfl compare runs/reproduce/fr/before runs/reproduce/fr/after \
	  --out benchmarks/results/reproduce/issue35-fedavg-rounds/compare.json

clean-cache:
	rm -rf .cache/oneshotfl
