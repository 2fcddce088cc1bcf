"""Every exact float comparison in the tests says why it is exact (``tests/numerics.py``).

A test that compares two fp32 runs exactly holds only for the kernels of the CPU it was written on
(issue 45: AVX-512 turned CI red). Exact comparisons stay where both sides run the same kernels on
the same threads, or move bytes, or are plain Python arithmetic on the test's own figures; each says
so with ``exact:`` on its line or the line above. Others compare within ``tests/numerics.py``'s bounds.
"""

from __future__ import annotations

import re
from pathlib import Path

EXACT = re.compile(r"(==|!=) ?[\[(]?-?\d+\.\d+(e-?\d+)?\b|torch\.equal\(|array_equal\(|\.item\(\) ==")
HERE = Path(__file__).parent


def unexplained(text: str) -> list[int]:
    """Line numbers of exact float comparisons with no ``exact:`` on them or on the line above."""
    lines = text.splitlines()
    out = []
    for n, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if EXACT.search(code) and "pytest.approx" not in code and "exact:" not in line and (
                n == 0 or "exact:" not in lines[n - 1]):
            out.append(n + 1)
    return out


def test_the_scan_finds_an_unexplained_exact_comparison():
    assert unexplained("x = 1\nassert err == 0.0\n") == [2]
    assert unexplained("assert torch.equal(a, b)  # exact: bytes moved\n") == []
    assert unexplained("# exact: one kernel both sides\nassert np.array_equal(a, b)\n") == []
    assert unexplained("assert y == pytest.approx(0.5)\nassert n == 3\n") == []


def test_every_exact_float_comparison_in_the_tests_says_why():
    found = {p.name: unexplained(p.read_text()) for p in sorted(HERE.glob("*.py")) if p.name != Path(__file__).name}
    assert not {name: lines for name, lines in found.items() if lines}
