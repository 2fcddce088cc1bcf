"""One strategy run on a pool: validate its parameters, start the pool, run, return the Measurement.

The only module above the strategies that runs them (the CLI and the tuner call it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autohet.errors import UserError
from autohet.strategies import get_strategy

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.measurement import Measurement
    from autohet.pool import Pool

__all__ = ["run_strategy"]


def run_strategy(strategy_name: str, params: dict[str, Any], pool: Pool, ctx: RunContext) -> Measurement:
    """Validates params, starts the pool for the context's model/workload, runs the strategy."""
    strategy = get_strategy(strategy_name)
    if ctx.mode not in strategy.modes:
        raise UserError(f"strategy {strategy_name} does not serve {ctx.mode} runs (it serves "
                        f"{', '.join(strategy.modes)}); pick another --objective or strategy")
    checked = strategy.validate(strategy.defaults_for(pool.spec, params))
    strategy.check_pool(pool, checked)
    if not strategy.on_engine:
        pool.start(ctx.model, ctx.workload)
    return strategy.run(pool, ctx, checked)
