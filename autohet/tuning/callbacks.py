"""Ray Tune callbacks of a tune: every finished trial logged to MLflow at once, and the test hook
that kills the tune at a known point."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from autohet.tracking import TrialLogger
from autohet.tuning.progress import Progress

__all__ = ["KILL_ENV", "tune_callbacks"]

# Test hook: kill the whole tune (SIGKILL to its process group) as trial N+1 starts, once N trials
# are logged, so resume tests kill at a known point with a trial running, never by polling wall time.
KILL_ENV = "AUTOHET_TEST_KILL_AFTER"


def tune_callbacks(logger: TrialLogger, progress: Progress, logged: set[str]) -> list[Any]:
    from ray.tune import Callback

    kill_after = int(os.environ.get(KILL_ENV, "0") or 0)

    class TrialLogging(Callback):
        """Logs each finished trial at once, so a killed tune loses no finished trial; a trial is
        logged once even if Tune reports it twice."""

        def _log(self, trial: Any, result: dict) -> None:
            if trial.trial_id in logged:
                return
            logged.add(trial.trial_id)
            t0 = time.perf_counter()
            logger.log(progress.done + 1, trial.config, result, trial.trial_id)
            progress.update(result, time.perf_counter() - t0)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if kill_after and progress.done >= kill_after:
                # the whole tune (Ray's processes too) when it leads its process group, as a kill from
                # outside would; never a group it merely belongs to (a test runner's)
                if os.getpgrp() == os.getpid():
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self._log(trial, result)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._log(trial, {"strategy": trial.config.get("strategy"), "status": "error",
                              "error": f"trial crashed: {trial.error_file or 'see Ray logs'}"})

    return [TrialLogging()]
