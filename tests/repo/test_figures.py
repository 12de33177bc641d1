"""本书的示意图：生成的图与 python -m tools.book.make_figures 的输出逐字相同（图里的数由代码的同一套式子算出，不手填），
每张图（包括手画的两张）的文字都落在画布里，不会被裁掉。"""

from __future__ import annotations

import re

import pytest

from tools.book.figures_more import MORE
from tools.book.make_figures import FIGURES, OUT, ROOT
from tools.book.svgkit import SVG, text_width

ALL = {**FIGURES, **MORE}


@pytest.mark.parametrize("name", sorted(ALL))
def test_figure_matches_generator(name):
    path = OUT / f"{name}.svg"
    assert path.is_file(), f"缺 {path}：运行 python -m tools.book.make_figures"
    assert path.read_text(encoding="utf-8") == ALL[name]().render(), \
        f"{path} 和生成器的输出不同（手改过，或者代码变了）：运行 python -m tools.book.make_figures 重新生成"


def _overflowing(svg_text: str) -> list[str]:
    w, h = (float(v) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg_text).groups())
    bad = []
    for m in re.finditer(r'<text x="([\d.]+)" y="([\d.]+)" font-size="([\d.]+)"[^>]*text-anchor="(\w+)"[^>]*>([^<]*)<',
                         svg_text):
        x, y, size, anchor, s = float(m[1]), float(m[2]), float(m[3]), m[4], m[5]
        tw = text_width(s, size, "monospace" in m[0])
        left = {"start": x, "middle": x - tw / 2, "end": x - tw}[anchor]
        if left < 0 or left + tw > w or y > h:
            bad.append(s)
    return bad


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "images").glob("*.svg")), ids=lambda p: p.name)
def test_figure_text_fits(path):
    assert not _overflowing(path.read_text(encoding="utf-8")), f"{path.name} 的这些文字超出了画布，会被裁掉"


def test_overflow_check_catches_a_cut_caption():
    wide = SVG(200, 100, "t")
    wide.items.append('<text x="20" y="90" font-size="12" fill="#000" text-anchor="start">'
                      + "这一行说明太长了放不下" * 3 + "</text>")
    assert _overflowing(wide.render())
    with pytest.raises(ValueError, match="超出"):
        wide.text(20, 90, "这一行说明太长了放不下" * 3)
        wide.render()
