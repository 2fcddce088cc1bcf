"""``platform.memory.keep_large_blocks``: freed large blocks stay in the heap, so a process receiving one
10 MB message after another (a gRPC ingress) does not fault every page of every message in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

PAGES_PER_ROUND = 3 * (10 << 20) // 4096

# three 10 MB blocks allocated (zero-filled: every page touched) and freed, 40 times; the minor faults
_ROUNDS = """
import resource, sys
from autohet.platform.memory import keep_large_blocks
if sys.argv[1] == "keep" and not keep_large_blocks(1 << 30):  # clamped to 32 MB
    raise SystemExit("mallopt refused")
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    blocks = [bytearray(10 << 20) for _ in range(3)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_large_blocks_are_reused_instead_of_faulted_in_again() -> None:
    kept, default = _faults("keep"), _faults("default")
    assert kept < 3 * PAGES_PER_ROUND, kept  # the first round's pages, then the same blocks again
    assert default > 20 * PAGES_PER_ROUND, default  # glibc's default: returned and faulted in each round

