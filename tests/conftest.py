"""Shared pytest setup: hypothesis profiles (CI replays a fixed sequence of examples, so a red run
can be reproduced; local runs draw fresh ones) and no network for transformers."""
import os

from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
