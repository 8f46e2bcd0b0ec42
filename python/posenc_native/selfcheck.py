"""The main job's self-check: run every op on a small embedded problem on every available device and
compare with the float64 reference. Each op family adds its cases to CASES."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import ops, reference

# Tolerances of the numerics contract (DESIGN.md section 2): relative, norm-wise.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}


@dataclass
class Result:
    op: str
    device: str
    dtype: str
    error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


def rel_error(out: torch.Tensor, truth: torch.Tensor) -> float:
    """Norm-wise relative error ||out - truth|| / ||truth|| in float64."""
    out, truth = out.double().cpu(), truth.double().cpu()
    return float((out - truth).norm() / truth.norm().clamp_min(1e-300))


def _sinusoidal_table(device: str, dtype: torch.dtype) -> float:
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 1 << 20, (257,), generator=g)
    kw = dict(base=10000.0, interleaved=True)
    out = ops.sinusoidal_table(positions.to(device), 96, dtype=dtype, **kw)
    return rel_error(out, reference.sinusoidal_table(positions, 96, **kw))


def _add_sinusoidal(device: str, dtype: torch.dtype) -> float:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 33, 64, generator=g, dtype=torch.float64)
    out = ops.add_sinusoidal(x.to(device, dtype), offset=5, x_scale=8.0)
    return rel_error(out, reference.add_sinusoidal(x.to(dtype).double(), offset=5, x_scale=8.0))


# (op name, function(device, dtype) -> relative error)
CASES: list[tuple[str, Callable[[str, torch.dtype], float]]] = [
    ("sinusoidal_table", _sinusoidal_table),
    ("add_sinusoidal", _add_sinusoidal),
]


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run_all() -> list[Result]:
    results = []
    for device in devices():
        for name, fn in CASES:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                err = fn(device, dtype)
                results.append(Result(name, device, str(dtype).replace("torch.", ""), err, TOLERANCE[dtype]))
    return results
