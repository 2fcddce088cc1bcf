"""Models by name: torchvision classifiers, two small nets for the seed's experiments, user factories.

A model is built with random weights drawn from a seed (so every executor, on any node,
builds the same network without shipping weights) or loaded from a checkpoint file.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from autohet.core.errors import UserError

__all__ = ["CifarNet", "LeNet", "ModelSpec", "build_model", "check_checkpoint", "input_shape", "list_models"]


class LeNet(nn.Module):
    """LeNet-5 for 1x28x28 MNIST-shaped inputs (the seed's MNIST experiment)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2)
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(50 * 4 * 4, 500), nn.ReLU(inplace=True), nn.Linear(500, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CifarNet(nn.Module):
    """Caffe's CIFAR-10 'quick' net for 3x32x32 inputs (the seed's CIFAR-10 experiment)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 64), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


_SMALL = {"lenet": (LeNet, (1, 28, 28)), "cifarnet": (CifarNet, (3, 32, 32))}
_SMALL_ALIASES = {"cifar10": "cifarnet", "cifar": "cifarnet"}
# torchvision classifiers whose native input differs from 3x224x224
_TV_INPUT = {"inception_v3": (3, 299, 299)}


@dataclass(frozen=True)
class ModelSpec:
    """What an executor needs to build a model anywhere: its name, the weight seed, a checkpoint."""

    name: str
    seed: int = 0
    checkpoint: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "seed": self.seed, "checkpoint": self.checkpoint}


def _torchvision_names() -> list[str]:
    from autohet.core._tv import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def list_models() -> list[str]:
    """Every model name accepted by --model (user factories aside)."""
    return sorted(set(_SMALL) | set(_torchvision_names()))


def _canonical(name: str) -> str:
    return _SMALL_ALIASES.get(name.lower(), name.lower()) if ":" not in name else name


def _user_factory(name: str):
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r} for --model {name}: {exc}; "
                        "put the package on PYTHONPATH") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"{module_name!r} has no callable {attr!r}; --model takes package.module:factory")
    return factory


def input_shape(name: str) -> tuple[int, int, int]:
    """The C,H,W of one input image for a model name."""
    name = _canonical(name)
    if name in _SMALL:
        return _SMALL[name][1]
    if ":" in name:
        factory = _user_factory(name)
        shape = getattr(factory, "input_shape", None)
        if shape is None:
            raise UserError(f"user model {name} needs an input_shape attribute on its factory, e.g. "
                            "factory.input_shape = (3, 224, 224)")
        return tuple(shape)
    if name not in _torchvision_names():
        raise UserError(f"unknown model {name!r}; valid: lenet, cifarnet, any torchvision classifier "
                        "(e.g. vgg16, resnet18), or package.module:factory")
    return _TV_INPUT.get(name, (3, 224, 224))


# Random initialisation draws from torch's global generator: two threads building models at once
# (an in-process pool loading its executors) would interleave their draws and get other weights.
_BUILD_LOCK = threading.Lock()


def build_model(spec: ModelSpec | str, seed: int = 0, checkpoint: str | None = None) -> nn.Module:
    """Builds the model in eval mode with seeded random weights or a checkpoint's state dict."""
    if isinstance(spec, str):
        spec = ModelSpec(spec, seed, checkpoint)
    name = _canonical(spec.name)
    input_shape(name)  # validates the name with a helpful error
    with _BUILD_LOCK:
        state = torch.get_rng_state()
        torch.manual_seed(spec.seed)
        try:
            model = _construct(name)
        finally:
            torch.set_rng_state(state)
    if spec.checkpoint:
        state = _read_checkpoint(spec.checkpoint)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise UserError(f"checkpoint {spec.checkpoint} does not fit model {name}: {first}") from exc
    return model.eval()


def _construct(name: str) -> nn.Module:
    if name in _SMALL:
        return _SMALL[name][0]()
    if ":" in name:
        return _user_factory(name)()
    from autohet.core._tv import torchvision

    kwargs: dict = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    return torchvision.models.get_model(name, **kwargs)


def _read_checkpoint(checkpoint: str) -> dict:
    """The state dict in a .pt file; anything else is a one-line error naming the fix."""
    path = Path(checkpoint)
    if not path.is_file():
        raise UserError(f"checkpoint {path} not found; pass an existing .pt state-dict file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling, zip and weights_only errors: not a state dict we can read
        first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise UserError(f"checkpoint {path} is not a PyTorch state dict ({type(exc).__name__}: {first}); "
                        "save one with torch.save(model.state_dict(), path)") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict of tensors; save one "
                        "with torch.save(model.state_dict(), path)")
    return state


def check_checkpoint(spec: ModelSpec) -> None:
    """Fails in one line, before any executor starts, when the checkpoint cannot load into the model."""
    build_model(spec)
