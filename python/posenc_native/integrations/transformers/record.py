"""What :func:`patch` changed in one model, and how to undo it exactly.

Everything is recorded by path inside the model, so a deep copy or a pickle of a patched model
carries a record that refers to its own modules and holds its own reference on the module-level
rotation wrappers.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Optional

from torch import nn

from ...config import RopeConfig
from . import rotations
from .rotations import RotationSpec
from .runtime import _ERR, PosencRotaryEmbedding, UnsupportedModelError

RECORD_ATTR = "_posenc_rope_patch"


class PatchRecord:
    def __init__(self, model_type: str):
        self.model_type = model_type
        self.notes = ""
        self.rotary_paths: list[tuple[str, str]] = []  # (parent path, attribute) of swapped rotary modules
        self.overrides: list[tuple[str, str]] = []  # (module path, attribute) of instance-attribute overrides
        self.routes: list[tuple[str, str, RotationSpec]] = []  # wrapped rotation functions
        self.installed = False

    # -- filled by the family's patch function (nothing in the model changes until apply())
    def route(self, module_name: str, name: str, spec: RotationSpec) -> None:
        if not any(m == module_name and n == name for m, n, _ in self.routes):  # two parts may share one function
            self.routes.append((module_name, name, spec))

    def swap_module(self, model: nn.Module, path: str, new: nn.Module) -> None:
        parent, _, attr = path.rpartition(".")
        self._pending.append(("swap", parent, attr, new))

    def override(self, model: nn.Module, path: str, attr: str, value: Any) -> None:
        self._pending.append(("override", path, attr, value))

    def rope_config(self, model: nn.Module, layer_type: Optional[str] = None) -> RopeConfig:
        try:
            return RopeConfig.from_hf(model.config, layer_type=layer_type)
        except (NotImplementedError, ValueError, KeyError, TypeError) as e:
            raise UnsupportedModelError(f"{_ERR}: cannot read the rotary configuration of model type "
                                        f"{self.model_type!r}: {e}") from e

    @property
    def _pending(self) -> list:
        if "_pending_list" not in self.__dict__:
            self.__dict__["_pending_list"] = []
        return self.__dict__["_pending_list"]

    def apply(self, model: nn.Module) -> None:
        """Install the wrappers, then make the recorded swaps (all checks have passed by now)."""
        self.install()
        for kind, path, attr, value in self.__dict__.pop("_pending_list", []):
            if kind == "swap":
                setattr(model.get_submodule(path), attr, value)
                self.rotary_paths.append((path, attr))
            else:
                model.get_submodule(path).__dict__[attr] = value  # shadows the method
                self.overrides.append((path, attr))

    # -- module-level wrappers, reference counted
    def install(self) -> None:
        if self.installed:
            return
        done = []
        try:
            for module_name, name, spec in self.routes:
                importlib.import_module(module_name)
                rotations.install(module_name, name, spec)
                done.append((module_name, name))
        except BaseException:
            for module_name, name in reversed(done):
                rotations.uninstall(module_name, name)
            raise
        self.installed = True

    def release(self) -> None:
        if self.installed:
            self.installed = False
            for module_name, name, _ in reversed(self.routes):
                rotations.uninstall(module_name, name)

    def _clone(self) -> "PatchRecord":
        new = PatchRecord(self.model_type)
        new.notes = self.notes
        new.rotary_paths = list(self.rotary_paths)
        new.overrides = list(self.overrides)
        new.routes = list(self.routes)
        return new

    def __deepcopy__(self, memo) -> "PatchRecord":
        new = self._clone()
        if self.installed:
            new.install()
        return new

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_pending_list", None)
        return state

    def __setstate__(self, state: dict) -> None:
        installed = state.pop("installed", False)
        self.__dict__.update(state)
        self.installed = False
        if installed:
            self.install()

    def restore(self, model: nn.Module) -> None:
        self.__dict__.pop("_pending_list", None)
        for parent_path, attr in reversed(self.rotary_paths):
            parent = model.get_submodule(parent_path)
            ours = getattr(parent, attr, None)
            if isinstance(ours, PosencRotaryEmbedding):
                ours.sync_original()
                setattr(parent, attr, ours.original)
            else:
                warnings.warn(f"{_ERR}: {parent_path}.{attr} was replaced after patch; leaving it", RuntimeWarning,
                              stacklevel=3)
        for path, attr in reversed(self.overrides):
            module = model.get_submodule(path)
            module.__dict__.pop(attr, None)
        self.release()
