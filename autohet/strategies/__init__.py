"""Strategies: one base class, one registry, one module per family."""

from __future__ import annotations

from autohet.strategies.base import Strategy
from autohet.strategies.registry import STRATEGIES, get_strategy, register_strategy, strategy_names

__all__ = ["STRATEGIES", "Strategy", "get_strategy", "register_strategy", "strategy_names"]
