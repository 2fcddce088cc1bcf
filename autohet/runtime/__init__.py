"""The production runtime: an exported config running inference (``autohet.load``) and batch files
of images through it (``autohet run --config --input``)."""

from __future__ import annotations

from autohet.runtime.loader import load
from autohet.runtime.runner import Runner

__all__ = ["Runner", "load"]
