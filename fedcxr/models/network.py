"""The chest X-ray network: MONAI backbone → (projection) → class-named main head + aux heads.

DESIGN §4. One module, four named parts, so that aggregation rules can pick state-dict
entries by prefix without knowing the architecture:

==================  ==========================================================================
``backbone.``       MONAI DenseNet121 / ResNet (2-D, 1 input channel), its classifier removed;
                    outputs ``(B, F)`` pooled features
``proj.``           optional ``Linear(F, hidden) + ReLU`` (hidden 128 as in the AuxInfo+GP
                    paper); absent (no entries) when ``hidden`` is ``None``
``head.``           main head ``Linear(F', |classes|)``; row ``i`` belongs to ``classes[i]`` —
                    surgical aggregation matches rows **by class name** (:func:`select_head_rows`)
``aux_heads.<t>.``  one ``Linear(F', K_t)`` per auxiliary task (sex, age bin, race, view);
                    none when AuxInfo is off
==================  ==========================================================================

Weights come from a local file or a random init seeded by torch's global RNG; nothing is ever
downloaded (MONAI's ``pretrained=True`` would download, and drops the first conv's weights for
1-channel input — DESIGN §9).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedcxr.errors import UserError
from fedcxr.vocab import CLASS_SET

log = logging.getLogger(__name__)

BACKBONES = ("densenet121", "resnet18", "resnet10", "resnet_tiny")

StateDict = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- backbones


NORMS = ("batch", "group")
#: GroupNorm groups: divides every channel count of the backbones (8 … 1024)
GROUPS = 8


def _norm(norm: str):
    """MONAI's norm argument: BatchNorm (default) or GroupNorm (DP-SGD: Opacus refuses BatchNorm)."""
    if norm not in NORMS:
        raise UserError(f"model.norm: unknown normalisation {norm!r}; choose one of {', '.join(NORMS)}")
    return "batch" if norm == "batch" else ("group", {"num_groups": GROUPS})


def _group_norm_everywhere(module: nn.Module) -> nn.Module:
    """Every BatchNorm of ``module`` replaced by a GroupNorm of the same width (fresh affine init).

    MONAI 1.6's ``ResNet(norm=...)`` normalises only the stem that way; its residual blocks
    keep BatchNorm (``_make_layer`` is not passed ``norm``), so the swap is done here.
    """
    for name, child in module.named_children():
        if isinstance(child, _BatchNorm):
            setattr(module, name, nn.GroupNorm(GROUPS, child.num_features, eps=child.eps, affine=child.affine))
        else:
            _group_norm_everywhere(child)
    return module


#: ResNet stems: ``imagenet`` (7x7 stride-2 conv + max-pool, torchvision's) or ``small``
#: (3x3 stride-1 conv, no max-pool: the CIFAR-style ResNet MedMNIST trains on 28 px images,
#: where the ImageNet stem leaves a 7x7 map after two layers). DenseNet keeps its own stem.
STEMS = ("imagenet", "small")


def _resnet(layers: list[int], inplanes: list[int], in_channels: int, norm: str = "batch",
            stem: str = "imagenet") -> nn.Module:
    from monai.networks.nets import ResNet

    # conv1_t_stride=2 gives the torchvision stem (stride-2 7x7 conv + max-pool): 7x faster
    # than MONAI's stride-1 default at the same accuracy class (DESIGN §9).
    shape = {"conv1_t_size": 7, "conv1_t_stride": 2} if stem == "imagenet" else \
        {"conv1_t_size": 3, "conv1_t_stride": 1, "no_max_pool": True}
    net = ResNet(
        block="basic",
        layers=layers,
        block_inplanes=inplanes,
        spatial_dims=2,
        n_input_channels=in_channels,
        feed_forward=False,
        norm=_norm(norm),
        **shape,
    )
    return _group_norm_everywhere(net) if norm == "group" else net


def make_backbone(name: str, in_channels: int = 1, norm: str = "batch",
                  stem: str = "imagenet") -> tuple[nn.Module, int]:
    """A MONAI 2-D backbone without classifier, and its feature width ``F``.

    ``forward(x: (B, in_channels, H, W)) -> (B, F)``. ``norm``: ``batch`` or ``group``
    (GroupNorm of :data:`GROUPS` groups, for DP-SGD). ``stem``: one of :data:`STEMS` (ResNets).
    """
    if stem not in STEMS:
        raise UserError(f"model.stem: unknown stem {stem!r}; choose one of {', '.join(STEMS)}")
    if stem != "imagenet" and not name.startswith("resnet"):
        raise UserError(f"model.stem: {stem!r} applies to the ResNet backbones, not {name!r}")
    if name == "densenet121":
        from monai.networks.nets import DenseNet121

        net = DenseNet121(spatial_dims=2, in_channels=in_channels, out_channels=1, pretrained=False,
                          norm=_norm(norm))
        if norm == "group":
            _group_norm_everywhere(net)
        width = net.class_layers.out.in_features
        net.class_layers.out = nn.Identity()  # keep relu → pool → flatten, drop the Linear
        return net, width
    if name == "resnet18":
        return _resnet([2, 2, 2, 2], [64, 128, 256, 512], in_channels, norm, stem), 512
    if name == "resnet10":
        return _resnet([1, 1, 1, 1], [64, 128, 256, 512], in_channels, norm, stem), 512
    if name == "resnet_tiny":  # for tests and the demo: ~0.1 M parameters
        return _resnet([1, 1, 1, 1], [8, 16, 32, 64], in_channels, norm, stem), 64
    raise UserError(f"model.backbone: unknown backbone {name!r}; choose one of {', '.join(BACKBONES)}")


# --------------------------------------------------------------------------- the network


class CXRNet(nn.Module):
    """Backbone → optional projection → main head (rows named by class) + aux heads.

    ``forward(x)`` takes ``(B, in_channels, H, W)`` float images (normalised as
    :mod:`fedcxr.pipeline.data` does) and returns ``{"main": (B, C) logits,
    "aux": {task: (B, K_task) logits}}`` — logits, never probabilities: the losses apply
    sigmoid/softmax themselves.
    """

    def __init__(
        self,
        classes: Sequence[str],
        *,
        backbone: str = "resnet18",
        hidden: Optional[int] = 128,
        aux_tasks: Optional[Mapping[str, int]] = None,
        in_channels: int = 1,
        weights: str | Path | None = None,
        norm: str = "batch",
        stem: str = "imagenet",
    ) -> None:
        super().__init__()
        self.classes: list[str] = _check_classes(classes)
        self.aux_tasks: dict[str, int] = {str(t): int(k) for t, k in (aux_tasks or {}).items()}
        self.backbone_name = backbone
        self.backbone, width = make_backbone(backbone, in_channels, norm, stem)
        self.feature_dim = width
        if hidden:
            self.proj: nn.Module = nn.Sequential(nn.Linear(width, int(hidden)), nn.ReLU(inplace=True))
            self.feature_dim = int(hidden)
        else:
            self.proj = nn.Identity()
        self.head = nn.Linear(self.feature_dim, len(self.classes))
        self.aux_heads = nn.ModuleDict(
            {task: nn.Linear(self.feature_dim, k) for task, k in self.aux_tasks.items()}
        )
        self.load_report: Optional[dict[str, Any]] = None
        if weights is not None:
            self.load_report = load_weights(self, weights)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, in_channels, H, W)`` → ``(B, F')`` features after the projection."""
        return self.proj(self.backbone(x))

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        feats = self.features(x)
        return {"main": self.head(feats), "aux": {t: h(feats) for t, h in self.aux_heads.items()}}


def network_from_config(classes: Sequence[str], model_cfg: Mapping[str, Any],
                        aux_tasks: Optional[Mapping[str, int]] = None, *, load_weights_file: bool = True) -> "CXRNet":
    """The network a run's ``model:`` block describes (config or ``final_model.pt``'s copy of it).

    One place, so training, evaluation, prediction and the bundle build the same architecture
    (backbone, projection, norm, stem); ``load_weights_file`` False skips ``model.weights`` (a
    finished run's own weights are loaded instead)."""
    return CXRNet(
        classes, backbone=model_cfg.get("backbone") or "resnet18", hidden=model_cfg.get("hidden", 128),
        aux_tasks=aux_tasks, weights=model_cfg.get("weights") if load_weights_file else None,
        norm=model_cfg.get("norm") or "batch", stem=model_cfg.get("stem") or "imagenet",
    )


def _check_classes(classes: Sequence[str]) -> list[str]:
    out = [str(c) for c in classes]
    if not out:
        raise UserError("model.classes: at least one class is needed")
    unknown = [c for c in out if c not in CLASS_SET]
    if unknown:
        raise UserError(f"model.classes: not canonical class name(s) {unknown} (see fedcxr.vocab.CLASSES)")
    if len(set(out)) != len(out):
        raise UserError(f"model.classes: duplicate class names in {out}")
    return out


# --------------------------------------------------------------------------- local weights

_DENSE_TV = re.compile(
    r"^(.*denselayer\d+)\.(norm|relu|conv)\.?([12])\.(weight|bias|running_mean|running_var|num_batches_tracked)$")
_CLASSIFIER_PREFIXES = ("fc.", "classifier.", "class_layers.out.")


def load_weights(model: CXRNet, path: str | Path) -> dict[str, Any]:
    """Load a local checkpoint into ``model`` (non-strict) and return/log what did not match.

    Warm start from a fedcxr run: a run's ``final_model.pt`` or a round checkpoint
    (``checkpoints/round_NNNN.pt``) gives its **global** weights. Their main head is matched
    to ``model``'s **by class name** (the file's classes come from ``final_model.pt``, from the
    checkpoint, or, for a checkpoint written before checkpoints carried them, from the run's
    ``run.json``); rows of classes the file lacks keep their fresh init, and the report lists
    them under ``new_head_classes``.

    Also accepts our own state dicts (``backbone.``/``proj.``/``head.`` keys), ``{'state_dict': ...}``
    or ``{'model': ...}`` wrappers, ``module.`` (DataParallel) prefixes, and bare backbone state
    dicts from MONAI, torchvision or TorchXRayVision (ResNet keys coincide; torchvision/TorchXRayVision
    DenseNet ``denselayerN.norm1`` — or the old ``norm.1`` — keys are renamed to MONAI's
    ``denselayerN.layers.norm1``). Their classifiers (``fc``, ``classifier``) are dropped and
    listed under ``dropped``. A 3-channel first conv loading into a 1-channel model has its
    RGB kernels summed (a gray image is R = G = B, so the response is unchanged). A conv whose
    weight comes from a file without its bias (torchvision's ResNet shortcut convs have none,
    MONAI's do) gets a zero bias: exactly the file's layer (``zero_bias``).

    What does not fit is reported, never silent: keys of the file the model lacks
    (``unexpected``, e.g. TorchXRayVision's ``op_threshs``), model entries the file lacks
    (``missing``: random init), entries of another shape (``shape_mismatch``: skipped); a
    backbone entry left randomly initialised is a WARNING naming how many and the first few
    (the file is probably another architecture). Raises :class:`UserError` when the file is
    missing, unreadable, not plain tensors (the file is loaded with ``weights_only=True``: code
    in a pickle is never run), or matches no backbone entry at all (wrong file).
    """
    import pickle

    path = Path(path)
    if not path.is_file():
        raise UserError(f"model.weights: {path} does not exist")
    expected = "expected a fedcxr final_model.pt, a fedcxr checkpoint or a PyTorch state dict of tensors"
    try:  # weights_only: tensors and plain containers only, a crafted pickle cannot run code
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"model.weights: {path}: refused to load this file: it holds more than tensors and "
                        f"plain values ({first}); fedcxr never runs code from a file; {expected}") from None
    except Exception as exc:  # noqa: BLE001 - any other failure is the user's file (truncated, not torch)
        raise UserError(f"model.weights: cannot read {path} as a PyTorch checkpoint "
                        f"({type(exc).__name__}: {str(exc)[:200]}); {expected}") from None
    state, file_classes = _unwrap_run_file(raw, path)
    if state is None:
        state = _unwrap(raw, path)
    ours = any(k.startswith("backbone.") for k in state)  # else a bare backbone: its classifier is dropped
    dropped = [] if ours else sorted(k for k in state if k.startswith(_CLASSIFIER_PREFIXES))
    state = _to_model_keys(state)
    own = model.state_dict()
    new_classes: list[str] = []
    if file_classes is not None:
        new_classes = _match_head_rows(state, file_classes, model.classes, own)
    usable: StateDict = {}
    mismatched: list[str] = []
    for key, value in state.items():
        if key not in own:
            continue
        value = _adapt_first_conv(key, value, own[key])
        if value.shape != own[key].shape:
            mismatched.append(f"{key} {tuple(value.shape)}→{tuple(own[key].shape)}")
            continue
        usable[key] = value
    if not any(k.startswith("backbone.") for k in usable):
        raise UserError(
            f"model.weights: {path} matches no entry of the {model.backbone_name} backbone "
            f"(first keys in the file: {[k.removeprefix('backbone.') for k in list(state)[:3]]}); fedcxr loads "
            "DenseNet-121 and ResNet-18/10 state dicts in torchvision, TorchXRayVision or MONAI layout "
            "(README: Pretrained weights)"
        )
    zero_bias = _zero_missing_conv_biases(usable, own)
    result = model.load_state_dict(usable, strict=False)
    report = {
        "file": str(path),
        "loaded": len(usable),
        "missing": list(result.missing_keys),
        "unexpected": sorted(k for k in state if k not in own),
        "shape_mismatch": mismatched,
        "dropped": dropped,
        "zero_bias": zero_bias,
        "file_classes": file_classes,
        "new_head_classes": new_classes,
    }
    _warn_random_backbone(model, path, own, usable)
    if new_classes:
        log.info("head rows of %s are freshly initialised (not among the file's classes %s)",
                 new_classes, file_classes)
    log.info(
        "loaded %d entries from %s; %d missing (random init), %d unexpected, %d shape mismatch",
        report["loaded"], path.name, len(report["missing"]), len(report["unexpected"]), len(mismatched),
    )
    for kind in ("missing", "unexpected", "shape_mismatch", "dropped", "zero_bias"):
        if report[kind]:
            log.info("  %s: %s%s", kind, report[kind][:8], " ..." if len(report[kind]) > 8 else "")
    return report


def _zero_missing_conv_biases(usable: StateDict, own: StateDict) -> list[str]:
    """Zero biases for conv weights taken from a file that has none for them (torchvision's ResNet
    shortcut ``downsample.0`` convs are bias-free; MONAI's carry a bias): a zero bias is exactly
    the file's layer, where a random one would shift what the next BatchNorm sees."""
    zeroed = []
    for key in list(usable):
        if not key.endswith(".weight") or usable[key].dim() != 4:
            continue
        bias = key[: -len("weight")] + "bias"
        if bias in own and bias not in usable:
            usable[bias] = torch.zeros_like(own[bias])
            zeroed.append(bias)
    return zeroed


def _warn_random_backbone(model: CXRNet, path: Path, own: StateDict, usable: StateDict) -> None:
    """A WARNING when backbone entries keep their random init (the file is another architecture?)."""
    wanted = [k for k in own if k.startswith("backbone.") and not k.endswith("num_batches_tracked")]
    left = [k for k in wanted if k not in usable]
    if left:
        log.warning("model.weights: %d of %d %s backbone entries are not in %s or have another shape, so they "
                    "stay randomly initialised (is the file a %s?): %s%s", len(left), len(wanted),
                    model.backbone_name, path.name, model.backbone_name,
                    ", ".join(k.removeprefix("backbone.") for k in left[:5]), " ..." if len(left) > 5 else "")


def _unwrap_run_file(raw: Any, path: Path) -> tuple[Optional[StateDict], Optional[list[str]]]:
    """``(global weights, their head classes)`` of a fedcxr ``final_model.pt`` or round
    checkpoint; ``(None, None)`` for anything else (a plain state dict goes through :func:`_unwrap`)."""
    if not isinstance(raw, Mapping):
        return None, None
    if isinstance(raw.get("global"), Mapping):  # final_model.pt
        weights, classes = raw["global"], raw.get("classes")
    elif {"round", "fingerprint", "state"} <= set(raw) and isinstance(raw["state"], Mapping) \
            and isinstance(raw["state"].get("global"), Mapping):  # checkpoints/round_NNNN.pt
        weights, classes = raw["state"]["global"], raw.get("classes") or _run_json_classes(path)
    else:
        return None, None
    if not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise UserError(f"model.weights: {path}: the run file's global weights are not all tensors")
    if classes is None:
        log.warning("model.weights: %s names no head classes (no run.json beside it): the main head is "
                    "loaded only if its shape matches", path)
    return {str(k): v for k, v in weights.items()}, (list(classes) if classes is not None else None)


def _run_json_classes(checkpoint: Path) -> Optional[list[str]]:
    """Head classes from ``RUN_DIR/run.json`` for ``RUN_DIR/checkpoints/round_NNNN.pt``."""
    from fedcxr.errors import UserError
    from fedcxr.rundir import read_run_info

    try:
        classes = read_run_info(checkpoint.resolve().parent.parent).get("classes")
    except (OSError, UserError):
        return None
    return [str(c) for c in classes] if isinstance(classes, list) else None


def _match_head_rows(state: StateDict, file_classes: list[str], classes: list[str], own: StateDict) -> list[str]:
    """Rewrite ``state``'s main head (rows in ``file_classes`` order) into ``classes`` order, in place.

    Rows of classes the file has are copied; the others take ``own``'s (fresh init) rows.
    Returns the classes that stay freshly initialised. A head whose width disagrees with the
    file's class list is left alone (the shape check reports it).
    """
    weight, bias = state.get("head.weight"), state.get("head.bias")
    if weight is None or bias is None or weight.shape[0] != len(file_classes) \
            or weight.shape[1:] != own["head.weight"].shape[1:]:
        return [c for c in classes if c not in file_classes]
    position = {c: i for i, c in enumerate(file_classes)}
    new_weight, new_bias = own["head.weight"].clone(), own["head.bias"].clone()
    for row, cls in enumerate(classes):
        if cls in position:
            new_weight[row] = weight[position[cls]]
            new_bias[row] = bias[position[cls]]
    state["head.weight"], state["head.bias"] = new_weight, new_bias
    return [c for c in classes if c not in position]


def _unwrap(raw: Any, path: Path) -> StateDict:
    for key in ("state_dict", "model", "model_state_dict", "state"):
        if isinstance(raw, Mapping) and key in raw and isinstance(raw[key], Mapping):
            raw = raw[key]
            break
    if not isinstance(raw, Mapping) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        raise UserError(f"model.weights: {path} is not a state dict of tensors")
    return {str(k).removeprefix("module."): v for k, v in raw.items()}


def _to_model_keys(state: StateDict) -> StateDict:
    """Our own checkpoints pass through; a bare backbone gets ``backbone.`` and MONAI names."""
    if any(k.startswith("backbone.") for k in state):
        return dict(state)
    out: StateDict = {}
    for key, value in state.items():
        if key.startswith(_CLASSIFIER_PREFIXES):
            continue
        match = _DENSE_TV.match(key)
        if match:
            key = f"{match.group(1)}.layers.{match.group(2)}{match.group(3)}.{match.group(4)}"
        out[f"backbone.{key}"] = value
    return out


def _adapt_first_conv(key: str, value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum RGB kernels of a conv weight (O, 3, kh, kw) into a 1-channel one (O, 1, kh, kw)."""
    if (
        value.dim() == 4
        and target.dim() == 4
        and value.shape[1] == 3
        and target.shape[1] == 1
        and value.shape[0] == target.shape[0]
        and value.shape[2:] == target.shape[2:]
    ):
        log.info("summing the RGB kernels of %s into one gray input channel", key)
        return value.sum(dim=1, keepdim=True)
    return value


# --------------------------------------------------------------------------- key groups


def _bn_modules(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, _BatchNorm)]


def bn_keys(model: nn.Module) -> list[str]:
    """State-dict keys of every BatchNorm layer (FedBN keeps these local), in state_dict order."""
    owners = set(_bn_modules(model))
    return [k for k in model.state_dict() if k.rpartition(".")[0] in owners]


def head_keys(model: nn.Module) -> list[str]:
    """Main-head entries (``head.weight``, ``head.bias``)."""
    return [k for k in model.state_dict() if k.startswith("head.")]
