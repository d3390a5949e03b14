"""Typed plugin state as stored (raysim.stored): the plain dict of its fields out, the plugin's
dataclasses back."""

import dataclasses

import pytest
import torch

from raysim.stored import from_plain, plain


@dataclasses.dataclass(frozen=True)
class _Inner:
    w: torch.Tensor


@dataclasses.dataclass(frozen=True)
class _Kept:
    inner: _Inner
    maybe: _Inner | None
    steps: int


def test_client_state_with_a_nested_dataclass_comes_back_typed():
    """What the client-state store saves (``plain``) is rebuilt as the plugin's ``ClientState``,
    nested dataclasses included, not left as dicts."""
    kept = _Kept(_Inner(torch.ones(2)), _Inner(torch.zeros(1)), 3)
    saved = plain(kept)
    assert saved == {"inner": {"w": kept.inner.w}, "maybe": {"w": kept.maybe.w}, "steps": 3}
    back = from_plain(_Kept, saved, "client 0's state")
    assert isinstance(back.inner, _Inner) and isinstance(back.maybe, _Inner) and back.steps == 3
    assert torch.equal(back.inner.w, kept.inner.w)
    assert from_plain(_Kept, plain(_Kept(_Inner(torch.ones(1)), None, 0)), "x").maybe is None
    with pytest.raises(ValueError, match=r"_Inner keeps \['w'\]"):
        from_plain(_Kept, {"inner": {"v": 1}, "maybe": None, "steps": 0}, "client 0's state")
