"""测试页的用量表（docs/snippets/suite_profile.md）：是 tools/suite/profile.py 按一次全量的记录写的，自洽、写明机器。"""

import re
from pathlib import Path

from tools.suite import profile

ROOT = Path(__file__).resolve().parents[2]


def _run(n_tests: int = 30) -> dict:
    parts = {"仓库级": dict(peak_mb=900, cpu_s=300.4, wall_s=160.0), "ch6_engine_sampler": dict(
        peak_mb=1200, cpu_s=170.2, wall_s=150.0), "文档": dict(peak_mb=700, cpu_s=80.0, wall_s=90.0)}
    slowest = {f"仓库级\ttests/repo/test_x.py::test_{i}": float(n_tests - i) for i in range(profile.SLOWEST)}
    return dict(date="2026-12-07 00:00 UTC", cpu="某 CPU family 1 model 2", cores=2, wall=250.0, jobs=2, threads="1",
                parts=parts, slowest=slowest)


def _tables(text: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|") and not line.startswith("|---"):
            cur.append([c.strip() for c in line.strip("|").split("|")])
        elif not line.startswith("|---") and cur:
            tables.append(cur[1:])
            cur = []
    return tables


def _check(text: str) -> None:
    assert re.search(r"机器：\S.*，\d+ 核", text), "没写机器"
    total = float(re.search(r"各份 CPU 秒合计 (\d+) s", text).group(1))
    parts, slow = _tables(text)
    cpu = [float(row[2]) for row in parts]
    assert cpu == sorted(cpu, reverse=True) and abs(sum(cpu) - total) <= len(cpu), (cpu, total)
    secs = [float(row[2]) for row in slow]
    assert 0 < len(slow) <= profile.SLOWEST and secs == sorted(secs, reverse=True)
    assert {row[0] for row in slow} <= {row[0] for row in parts}


def test_render_is_consistent():
    text = profile.render(_run())
    _check(text)
    assert "某 CPU family 1 model 2，2 核" in text and len(_tables(text)[1]) == profile.SLOWEST


def test_the_committed_snippet_is_what_the_tool_writes():
    text = (ROOT / "docs" / "snippets" / "suite_profile.md").read_text(encoding="utf-8")
    assert text.startswith("<!-- 由 tools/suite/profile.py 生成") and profile.COMMAND in text.splitlines()[0]
    _check(text)
