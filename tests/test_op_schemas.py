"""The Python side follows the ops' schemas (csrc/registration.h declares each argument list once):
every op has a fake kernel, and the argument names Python binds fake kernels and autograd to
(posenc_native/_op_args.py) are the registered schema's, so a C++ schema change that Python did not
follow fails here with the op and the argument named."""
from __future__ import annotations

import pytest
import torch
from torch._library import simple_registry

import posenc_native  # noqa: F401  (loads the library and registers the fake kernels)
from posenc_native import _op_args, reference


def _posenc_ops() -> list[str]:
    names = sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("posenc::"))
    assert len(names) >= 12, names  # build_info, 2 sinusoidal, 4 rope, 5 bias ops at least
    return names


def _schema(name: str):
    return getattr(torch.ops.posenc, name).default._schema


def _has_tensors(name: str) -> bool:
    s = _schema(name)
    return any("Tensor" in str(a.type) for a in list(s.arguments) + list(s.returns))


@pytest.mark.parametrize("name", _posenc_ops())
def test_every_tensor_op_has_a_fake_kernel(name):
    if not _has_tensors(name):  # build_info: nothing to trace
        return
    entry = simple_registry.singleton.find(f"posenc::{name}")
    assert entry.fake_impl.kernel is not None, (
        f"posenc.{name} has no fake kernel: torch.compile/export cannot trace it. Register one with "
        "torch.library.register_fake in posenc_native/ops.py or bias.py")


@pytest.mark.parametrize("name", _posenc_ops())
def test_python_binding_matches_schema(name):
    schema = _schema(name)
    want = tuple(a.name for a in schema.arguments)
    got = _op_args.op_args(name)._fields
    assert got == want, f"posenc.{name}: Python binds arguments {got}, the registered schema has {want}"
    # bind() names the positional arguments torch hands a fake kernel / setup_context, filling the
    # trailing defaults a caller left out (registration.h emits no keyword-only argument, and
    # defaults only for arguments appended to an op: add_sinusoidal's offset)
    kwarg_only = [a.name for a in schema.arguments if a.kwarg_only]
    assert not kwarg_only, f"posenc.{name}: arguments {kwarg_only} are keyword-only; teach _op_args.bind them"
    defaults = {a.name: a.default_value for a in schema.arguments if a.default_value is not None}
    assert _op_args.op_args(name)._field_defaults == defaults, (
        f"posenc.{name}: defaults {defaults} are not all trailing; teach _op_args.bind them")


def test_a_call_without_the_trailing_default_binds_it():
    """add_sinusoidal as written before it had an offset (TorchScript, C++ and positional Python
    callers): the fake kernel and autograd see offset 0, and the op adds the given positions alone."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 5, 12, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.randint(0, 99, (5,), generator=g)
    old_style = (x, pos, 2.0, 10000.0, True, 0.0, 1.0, False)
    assert _op_args.bind("add_sinusoidal", old_style).offset == 0
    out = torch.ops.posenc.add_sinusoidal(*old_style)
    torch.testing.assert_close(out, reference.add_sinusoidal(x.detach(), pos, x_scale=2.0), rtol=0, atol=1e-12)
    out.sum().backward()  # (autograd's setup_context binds the same tuple)
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    compiled = torch.compile(lambda t: torch.ops.posenc.add_sinusoidal(t, pos, 2.0, 10000.0, True, 0.0, 1.0, False),
                             fullgraph=True, backend="aot_eager")  # (the fake kernel binds it too)
    torch.testing.assert_close(compiled(x.detach()), out.detach(), rtol=0, atol=0)


# The Python autograd passes arguments between ops by name (_op_args.call): the backward of each
# op below is computed by its partner, whose arguments are taken from the op's own (by name) or
# supplied by the backward (the names listed).
_PARTNERS = [
    ("rope", "rope", ("q", "k", "inverse")),
    ("rope_", "rope", ("q", "k", "inverse")),
    ("rope_cos_sin", "rope_cos_sin", ("q", "k", "inverse")),
    ("rope_cos_sin_", "rope_cos_sin", ("q", "k", "inverse")),
    ("add_sinusoidal", None, ("x_scale",)),
    ("sinusoidal_table", None, ("positions",)),  # (its autograd only refuses positions that want a gradient)
    ("relative_position_bias", "relative_position_bias_backward", ("grad",)),
    ("relative_position_bias_backward", "relative_position_bias", ("weight", "query_length", "key_length")),
    ("alibi_bias", "alibi_bias_backward", ("grad",)),
    ("alibi_bias_backward", "alibi_bias", ("slopes", "query_length", "key_length", "dtype")),
]


@pytest.mark.parametrize("op, partner, given", _PARTNERS)
def test_autograd_partners_share_argument_names(op, partner, given):
    fields = set(_op_args.op_args(op)._fields)
    if partner is None:  # the backward reads these arguments of the op itself
        missing = set(given) - fields
        assert not missing, f"posenc.{op}'s autograd reads arguments {sorted(missing)} that its schema lacks"
        return
    needed = set(_op_args.op_args(partner)._fields) - set(given)
    missing = needed - fields
    assert not missing, (f"posenc.{op}'s backward calls posenc.{partner}, whose arguments {sorted(missing)} "
                         f"{op} does not have (by name): rename them alike or pass them in its backward")


def test_every_differentiable_op_is_covered():
    """A new op with an autograd formula (or one without a partner listed above) is noticed here."""
    with_autograd = {n for n in _posenc_ops() if n != "build_info"
                     and torch._C._dispatch_has_kernel_for_dispatch_key(f"posenc::{n}", "Autograd")}
    listed = {op for op, _, _ in _PARTNERS}
    assert with_autograd <= listed, f"ops with autograd not listed in _PARTNERS: {sorted(with_autograd - listed)}"


def test_call_binds_by_name():
    """_op_args.call fills each argument from the source by name, overrides first (checked on a
    real op against the reference: a swapped argument would change the result)."""
    slopes = torch.rand(4, dtype=torch.float64) + 0.1
    src = _op_args.bind("alibi_bias", (slopes, 3, 5, 2, None))
    got = _op_args.call("alibi_bias", src, query_offset=7)
    i = torch.arange(3, dtype=torch.float64).view(3, 1)
    j = torch.arange(5, dtype=torch.float64).view(1, 5)
    want = slopes.view(4, 1, 1) * (j - (i + 7))
    torch.testing.assert_close(got[0], want)
