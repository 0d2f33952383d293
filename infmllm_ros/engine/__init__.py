"""The engine: bounded KV caches and streaming sessions over Hugging Face MLLMs. Knows nothing of ROS."""
