"""第 6 章任务 3 的图（docs/images/cuda-graph-replay.svg）是在模拟的 CUDA 上真录、真放一步读出来的：
提交的文件和 tests/harness/graph_figure.py 现在的输出逐字相同，页面引用它。"""

from __future__ import annotations

import pytest

from tests.harness import graph_figure
from tools.manifest import ROOT


def test_graph_figure_matches_generator():
    why = graph_figure.problem()
    if why:
        pytest.skip(why)
    assert graph_figure.OUT.is_file(), f"缺 {graph_figure.OUT}：运行 python -m tests.harness.graph_figure"
    assert graph_figure.OUT.read_text(encoding="utf-8") == graph_figure.cuda_graph_replay().render(), \
        f"{graph_figure.OUT.name} 和生成器的输出不同：运行 python -m tests.harness.graph_figure 重新生成"


def test_ch6_page_shows_the_graph_figure():
    assert f"images/{graph_figure.NAME}.svg" in (ROOT / "docs" / "ch6.md").read_text(encoding="utf-8")
