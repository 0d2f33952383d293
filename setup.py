"""ament_python package definition: colcon on a robot and pip in a venv both build from here."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "infmllm_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    # kernels/ sits at the top level (the user's layout) but is installed inside our
    # namespace, so `import infmllm_ros.kernels` works and no bare `kernels` module leaks.
    packages=find_packages(exclude=["test", "test.*", "kernels", "kernels.*"]) + [f"{PACKAGE}.kernels"],
    package_dir={f"{PACKAGE}.kernels": "kernels"},
    package_data={PACKAGE: ["models/*/*.json", "models/*/*.safetensors", "models/*/*.txt", "models/*/*.jinja"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.py")),
        (f"share/{PACKAGE}/config", glob("config/*")),
    ],
    # Python dependencies live in requirements.txt (pinned, CPU torch) so that colcon on a robot
    # never pip-installs anything, and a system rclpy is never shadowed.
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="infmllm_ros maintainers",
    maintainer_email="maintainers@infmllm-ros.invalid",
    description="ROS 2 multimodal-LLM perception node with a bounded Inf-MLLM KV cache",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "infmllm_node = infmllm_ros.ros.node:main",
            "infmllm-run = infmllm_ros.ros.run:main",
            "infmllm-replay = infmllm_ros.ros.replay:main",
            "infmllm-demo = infmllm_ros.ros.demo:main",
            "infmllm-bench = infmllm_ros.benchmarks.cli:main",
            "infmllm-eval = infmllm_ros.evaluation:main",
            "infmllm-train-tiny = infmllm_ros.tiny_model.train:main",
            "infmllm-make-demo-bag = infmllm_ros.synthetic.demo_bag:main",
        ],
    },
)
