"""README、首页和第 0 步页面说骨架"不到 N 行"：这个数对得上 step0_skeleton/skeleton.py 的行数，也不是随口放宽的。"""

from __future__ import annotations

import re

from tools.manifest import ROOT

PAGES = ["README.md", "docs/index.md", "docs/step0.md"]
CLAIM = re.compile(r"不到 (\d+) 行")


def test_the_skeleton_is_as_short_as_the_pages_say():
    lines = (ROOT / "step0_skeleton" / "skeleton.py").read_text(encoding="utf-8").count("\n")
    for rel in PAGES:
        claims = [int(n) for n in CLAIM.findall((ROOT / rel).read_text(encoding="utf-8"))]
        assert claims, f"{rel} 不再说骨架有多少行：改这个测试的 PAGES"
        for n in claims:
            assert lines < n, f"{rel} 说骨架不到 {n} 行，step0_skeleton/skeleton.py 有 {lines} 行"
            assert n - lines <= 10, f"{rel} 说不到 {n} 行，其实只有 {lines} 行：把数改小"
