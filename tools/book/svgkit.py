"""tools.book.make_figures 用的一个极小的 SVG 画板：方框、文字、箭头，外加一张浅色卡片底。

暗色模式由 docs/stylesheets/extra.css 统一处理（整张图反色再转回色相），所以这里只画浅色版本。
文字宽度按字估算（汉字约一个字号宽，ASCII 约半个），save() 检查每段文字都落在画布里，不会被裁掉。
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

FONT = "PingFang SC, Noto Sans CJK SC, WenQuanYi Micro Hei, Microsoft YaHei, sans-serif"
MONO = "SFMono-Regular, Menlo, Consolas, DejaVu Sans Mono, monospace"
INK, MUTED, LINE = "#263238", "#546e7a", "#90a4ae"
BLUE, GREEN, ORANGE, PURPLE, RED, GREY = "#bbdefb", "#c8e6c9", "#ffe0b2", "#e1bee7", "#ffcdd2", "#eceff1"
DARK = {BLUE: "#1565c0", GREEN: "#2e7d32", ORANGE: "#e65100", PURPLE: "#6a1b9a", RED: "#c62828", GREY: "#546e7a"}


BUMP = 1


def text_width(s: str, size: float, mono: bool = False) -> float:
    if mono:
        return len(s) * size * 0.6
    return sum(size if ord(c) > 0x2E7F else size * 0.56 for c in s)


class SVG:
    def __init__(self, width: int, height: int, title: str) -> None:
        self.w, self.h, self.title = width, height, title
        self.items: list[str] = []
        self._texts: list[tuple[float, float, float, float, str]] = []  # 左、右、上、下、内容：检查越界用

    def rect(self, x: float, y: float, w: float, h: float, fill: str = "#ffffff", stroke: str = MUTED,
             dash: bool = False, rx: float = 3, width: float = 1) -> None:
        extra = ' stroke-dasharray="4 3"' if dash else ""
        self.items.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" fill="{fill}" '
                          f'stroke="{stroke}" stroke-width="{width:g}"{extra}/>')

    def text(self, x: float, y: float, s: str, size: float = 13, fill: str = INK, anchor: str = "middle",
             bold: bool = False, mono: bool = False) -> None:
        size += BUMP if size <= 12 else 0  # 图缩到正文栏宽（约 690 px）时，11、12 号字太小
        w = text_width(s, size, mono)
        left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
        self._texts.append((left, left + w, y - size, y + size * 0.25, s))
        family = f' font-family="{MONO}"' if mono else ""
        weight = ' font-weight="bold"' if bold else ""
        self.items.append(f'<text x="{x:g}" y="{y:g}" font-size="{size:g}" fill="{fill}" text-anchor="{anchor}"'
                          f'{family}{weight}>{escape(s)}</text>')

    def box(self, x: float, y: float, w: float, h: float, label: str, fill: str = "#ffffff", size: float = 13,
            mono: bool = False, dash: bool = False, stroke: str = MUTED, bold: bool = False, color: str = INK) -> None:
        self.rect(x, y, w, h, fill, stroke, dash)
        self.text(x + w / 2, y + h / 2 + size * 0.36, label, size, color, mono=mono, bold=bold)

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str = MUTED, width: float = 1.5,
             arrow: bool = False, dash: bool = False) -> None:
        head = f' marker-end="url(#arrow{DARK_IDS.get(color, DARK_IDS[MUTED])})"' if arrow else ""
        extra = ' stroke-dasharray="5 4"' if dash else ""
        self.items.append(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{color}" '
                          f'stroke-width="{width:g}"{extra}{head}/>')

    def path(self, d: str, color: str = MUTED, width: float = 1.5, arrow: bool = False) -> None:
        head = f' marker-end="url(#arrow{DARK_IDS.get(color, DARK_IDS[MUTED])})"' if arrow else ""
        self.items.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{width:g}"{head}/>')

    def caption(self, lines: list[str], y: float | None = None) -> None:
        """图下方的说明，左对齐；默认贴着画布底边往上排。"""
        y = self.h - 14 - 18 * (len(lines) - 1) if y is None else y
        for i, s in enumerate(lines):
            self.text(20, y + 18 * i, s, 12, MUTED, anchor="start")

    def render(self) -> str:
        bad = [s for left, right, top, bottom, s in self._texts
               if left < 2 or right > self.w - 2 or top < 0 or bottom > self.h - 2]
        if bad:
            raise ValueError(f"{self.title}：这些文字超出了 {self.w}x{self.h} 的画布：{bad}")
        markers = "".join(
            f'<marker id="arrow{mid}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{color}"/></marker>'
            for color, mid in DARK_IDS.items())
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.w} {self.h}" width="{self.w}" '
                f'height="{self.h}" role="img" font-family="{FONT}">\n<title>{escape(self.title)}</title>\n'
                f'<defs>{markers}</defs>\n'
                f'<rect x="0.5" y="0.5" width="{self.w - 1}" height="{self.h - 1}" rx="12" fill="#fafafa" '
                f'stroke="#b0bec5"/>\n')
        return head + "\n".join(self.items) + "\n</svg>\n"

    def save(self, path: Path) -> None:
        path.write_text(self.render(), encoding="utf-8")


DARK_IDS = {MUTED: "", INK: "-ink", **{c: f"-{i}" for i, c in enumerate(DARK.values())}}
