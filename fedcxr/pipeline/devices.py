"""Where a model runs: the device a user names (``--device``, ``device:``) and the memory layout.

Training (:mod:`fedcxr.pipeline.local`), forward passes (:mod:`fedcxr.pipeline.forward`),
prediction and FLARE clients resolve devices here, so ``auto``, ``cuda:N`` and a missing GPU
mean the same everywhere.
"""

from __future__ import annotations

import torch

from fedcxr.errors import UserError


def resolve_device(name: str | torch.device | None) -> torch.device:
    """``auto``/``None`` → CUDA when available, else CPU; ``cuda`` or ``cuda:N`` (GPU number N) when
    that GPU exists — a missing GPU is a user error naming the GPUs there are."""
    if isinstance(name, torch.device):
        return name
    text = (name or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UserError(f"--device: unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device: unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine (use cpu or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise UserError(f"--device {name}: this machine has {count} CUDA device(s): "
                        f"{', '.join(f'cuda:{i}' for i in range(count))}")
    return device


def memory_format(channels_last: bool) -> torch.memory_format:
    """NHWC (channels-last) or the model's own layout (``preserve_format`` leaves it as it is)."""
    return torch.channels_last if channels_last else torch.preserve_format


def place(model: torch.nn.Module, device: torch.device, layout: torch.memory_format) -> None:
    """``model.to(device, memory_format=layout)``, skipped when it would change nothing.

    Why: ``Module.to`` walks every module and re-assigns every tensor even when all of them are
    already where they should be — about a millisecond for a small network, paid by every task of
    every simulated site. With ``preserve_format`` and every parameter and buffer on ``device``
    the call is a no-op, so it is not made."""
    if layout == torch.preserve_format and all(t.device == device for t in model.parameters()) \
            and all(t.device == device for t in model.buffers()):
        return
    model.to(device, memory_format=layout)
