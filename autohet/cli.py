"""The ``autohet`` command. Bad input ends in one line naming the fix and a non-zero exit; SIGINT
and SIGTERM end in one line, Ray shut down, exit 130 / 143."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from autohet.core.errors import Interrupted, UserError
from autohet.core.settings import env

__all__ = ["main", "build_parser"]

_COMMANDS = ["profile", "run", "tune", "export", "compare", "ui", "graph", "compile", "serve"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"autohet: error: {message} (see `autohet {self.prog.split()[-1]} --help`)\n"
                  if " " in self.prog else f"autohet: error: {message} (see `autohet --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autohet", description=__doc__)
    subs = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"autohet.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"autohet.commands.{name}":
                raise
            continue
        module.register(subs)
    return parser


def _stop_ray() -> None:
    """Ends the local Ray this command started (its actors and workers), quietly."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        import contextlib
        import io

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ray.shutdown()


def _interrupt_in(exc: BaseException) -> BaseException | None:
    """The interrupt behind ``exc``, if any: a signal that lands while C code calls back into Python
    (a constructor in Ray or protobuf) comes back as a SystemError whose cause is our exception."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (KeyboardInterrupt, Interrupted)):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _interrupted(exc: BaseException) -> int:
    signum = getattr(exc, "signum", 2)
    _stop_ray()
    print(f"autohet: {'terminated' if signum == 15 else 'interrupted'}; Ray shut down", file=sys.stderr)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    from autohet.platform.ray_cluster import dump_stacks_later, handle_signals

    parser = build_parser()
    args = parser.parse_args(argv)
    previous = handle_signals()
    dump_stacks_later()  # AUTOHET_STACK_DUMP_S: in-process runs too, not only once Ray is up
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        cause = _interrupt_in(exc)
        if cause is not None:
            return _interrupted(cause)
        print(f"autohet: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as exc:
        return _interrupted(exc)
    except Exception as exc:
        cause = _interrupt_in(exc)
        if cause is not None:
            return _interrupted(cause)
        if env("AUTOHET_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"autohet: internal error: {type(exc).__name__}: {first} (rerun with AUTOHET_DEBUG=1 for the "
              "traceback and report it)", file=sys.stderr)
        return 1
    finally:
        import signal

        for sig, handler in previous.items():
            signal.signal(sig, handler)


def entry() -> None:
    """The console script: ``main``, then an exit that a still-running executor thread cannot abort.
    An in-process unit abandoned by a timed-out run cannot be cancelled; interpreter teardown under a
    thread inside a torch kernel ends in ``terminate called`` and SIGABRT, after complete output."""
    import threading

    code = main()
    busy = [t for t in threading.enumerate() if t.name.startswith("autohet-") and t.is_alive()]
    if busy:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
