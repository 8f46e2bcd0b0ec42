"""Shared pytest setup: hypothesis profiles (CI replays a fixed sequence of examples, so a red run
can be reproduced; local runs draw fresh ones) and no network for transformers."""
import os

from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# @pytest.mark.torch_min("2.14", "why"): the test needs a newer torch than the oldest one the wheel
# supports (posenc_native._library.TORCH_MIN); on an older torch it is skipped, saying which torch
# it needs and why (CI runs the suite on a second, older torch: `make test-second-torch`).
def pytest_configure(config):
    config.addinivalue_line("markers", "torch_min(version, reason): skip unless torch >= version")


def pytest_runtest_setup(item):
    import re

    import pytest
    import torch

    for mark in item.iter_markers("torch_min"):
        need = tuple(int(p) for p in str(mark.args[0]).split("."))
        have = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:len(need)])
        if have < need:
            reason = mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("reason", "")
            pytest.skip(f"needs torch>={mark.args[0]} (this is torch {torch.__version__}): {reason}")
