"""``--device`` / ``device:``: auto, cpu, cuda or cuda:N, and a clear error for a GPU that is not there."""

from __future__ import annotations

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.devices import resolve_device


def test_a_gpu_number_resolves_when_that_gpu_exists(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("CUDA") == torch.device("cuda")
    with pytest.raises(UserError, match=r"--device cuda:2: this machine has 2 CUDA device\(s\): cuda:0, cuda:1"):
        resolve_device("cuda:2")


def test_cuda_without_a_gpu_and_unknown_devices_are_user_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device(None) == torch.device("cpu")
    with pytest.raises(UserError, match="--device cuda:1: CUDA is not available on this machine"):
        resolve_device("cuda:1")
    with pytest.raises(UserError, match="use auto, cpu, cuda or cuda:N"):
        resolve_device("mps")


@pytest.mark.parametrize("value, expected", [("cuda:1", "cuda:1"), (" CPU ", "cpu"), ("auto", "auto")])
def test_the_config_accepts_a_gpu_number(value, expected):
    data = {"name": "x", "sites": ["a"], "strategy": "FedAvg", "device": value}
    assert load_config(data=data, check_sites=False).device == expected


def test_the_config_names_the_device_values_it_accepts():
    data = {"name": "x", "sites": ["a"], "strategy": "FedAvg", "device": "gpu"}
    with pytest.raises(UserError, match="device: 'gpu': use auto, cpu, cuda or cuda:N"):
        load_config(data=data, check_sites=False)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(None) == resolve_device("auto")
    with pytest.raises(UserError):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA"):
            resolve_device("cuda")
