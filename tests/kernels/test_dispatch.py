"""Choosing the attention backend once at engine start."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from pageserve_kernels import paged_attention as pa_module
from pageserve_kernels.dispatch import BackendError, select_backend
from tests.kernels.factories import assert_close_to_reference, make_batch


def test_auto_on_cpu_is_the_torch_path() -> None:
    assert select_backend("auto", "cpu").name == "torch"
    assert select_backend("torch", torch.device("cpu")).name == "torch"


def test_unknown_choice_is_refused() -> None:
    with pytest.raises(BackendError, match="'cuda'"):
        select_backend("cuda", "cpu")


def test_forcing_triton_on_cpu_needs_the_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
        select_backend("triton", "cpu")


def test_forcing_triton_under_the_interpreter() -> None:
    backend = select_backend("triton", "cpu")
    assert backend.name == "triton"
    assert backend.paged_attention is pa_module.paged_attention
    assert isinstance(pa_module._paged_attention_kernel, InterpretedFunction)


@pytest.mark.parametrize("choice", ["triton", "auto"])
def test_interpreter_on_a_cuda_device_is_refused(choice) -> None:
    """TRITON_INTERPRET=1 (set by this suite) with a CUDA cache would silently interpret every kernel."""
    with pytest.raises(BackendError, match="unset TRITON_INTERPRET"):
        select_backend(choice, "cuda")


@pytest.mark.parametrize("choice", ["torch", "triton"])
def test_both_backends_agree_with_the_reference(choice) -> None:
    backend = select_backend(choice, "cpu")
    batch = make_batch([1, 4], [30, 21], n_q=6, n_kv=2, head_dim=32, block_size=16, dtype=torch.float32)
    out = backend.paged_attention(*batch.args(), max_query_len=4, max_seq_len=30)
    assert_close_to_reference(out, batch.reference(), torch.float32)


@pytest.mark.gpu
def test_auto_on_cuda_is_triton() -> None:
    assert select_backend("auto", "cuda").name == "triton"
