"""本书：严格构建一遍，再在真的无头浏览器（Debian 的 chromium，Python playwright 驱动）里打开检查。

    python -m pytest tests/repo/test_site.py -q        # python -m tools.run_tests 的"文档"一项就是它

检查：里程碑页和一个章节页渲染出代码块（带复制按钮）、导航里每一页的图片都加载成功、搜索"页表"能找到第 4 章、
浏览器控制台没有错误；中文真的画成了字（没有 CJK 字体时每个汉字都是同一个方框，要失败）；运行输出折行，
"与 HF 一致: True"这类结论不会藏在横向滚动条后面；暗色方案下示意图反色。
没有 /usr/bin/chromium 时跳过并说明怎么装；设了环境变量 CI（.ci/run 会先装好它）时改为失败，CI 里绝不悄悄跳过。
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import re
import threading
from pathlib import Path

import pytest

from tests.harness.browser import CHROMIUM, LAUNCH_ARGS, unavailable

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / ".cache" / "site"


@pytest.fixture(scope="module")
def site() -> Path:
    """mkdocs build --strict：坏掉的 include、链接、chapter_diff、run(...) 都会让它失败。"""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(SITE)],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"mkdocs build --strict 失败：\n{res.stdout[-5000:]}\n{res.stderr[-5000:]}"
    return SITE


def test_site_builds_strict(site):
    for page in ("index.html", "milestone/index.html", "ch4/index.html", "glossary/index.html",
                 "search/search_index.json"):
        assert (site / page).is_file(), f"构建结果里没有 {page}"


@pytest.fixture(scope="module")
def base_url(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # 不把每个请求打进测试输出
        pass


@pytest.fixture
def page(browser, base_url):
    """一个新页面；测试结束时断言控制台没有错误（JS 异常、加载失败的资源都会出现在这里）。"""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.on("requestfailed", lambda req: errors.append(f"requestfailed: {req.url} {req.failure}"))
    pg.set_default_timeout(15_000)
    pg.base_url = base_url
    yield pg
    context.close()
    assert not errors, "浏览器控制台有错误：\n" + "\n".join(errors)


def _code_blocks(pg) -> int:
    return pg.locator(".md-content pre > code").count()


def test_milestone_page_renders_with_code_and_run_output(page):
    page.goto(page.base_url + "/milestone/", wait_until="networkidle")
    assert "阶段一里程碑" in page.locator("h1").first.inner_text()
    assert _code_blocks(page) >= 3, "里程碑页应该有命令、脚本和现跑的输出这几个代码块"
    assert page.locator(".md-content pre > code", has_text="stage1_milestone").count() >= 1
    output = page.locator(".md-content pre > code", has_text="与 HF 一致").last.text_content()  # 现跑的输出在脚本之后
    assert "与 HF 一致: False" not in output and output.count("与 HF 一致: True") == 4, output
    assert page.locator("button.md-code__button").count() >= 3, "代码块没有复制按钮（Material 的 JS 没有运行？）"
    assert page.locator("h2", has_text="CPU 上的实测").count() == 1


def test_chapter_page_renders_with_code_picture_and_collapsed_answers(page):
    page.goto(page.base_url + "/ch4/", wait_until="networkidle")
    assert "第 4 章" in page.locator("h1").first.inner_text()
    headings = [h.strip().rstrip("¶").strip() for h in page.locator(".md-content h2").all_inner_texts()]
    assert headings[:3] == ["学习目标", "动手前先预测", "任务"], headings
    assert _code_blocks(page) >= 5
    assert page.locator(".md-content pre > code", has_text="class MHAKVCache").count() >= 1, "没有渲染出 KV 池的代码"
    answers = page.locator("details.success")
    assert answers.count() >= 4 and not answers.first.evaluate("d => d.open"), "自测题答案应该是折叠的"
    img = page.locator("img[src*='page-table.svg']")
    assert img.count() == 1 and img.evaluate("i => i.complete && i.naturalWidth > 0"), "page table 的图没有加载出来"


def test_search_finds_chapter4_for_chinese_term(page):
    page.goto(page.base_url + "/", wait_until="networkidle")
    page.locator("label.md-search__icon, .md-search__input").first.click()
    box = page.locator("input.md-search__input")
    box.press_sequentially("页表", delay=50)
    box.press("End")  # Material 在 keyup 时读查询；playwright 输入中文不产生 keyup（输入法会），补一个不改字的键
    results = page.locator(".md-search-result__item a")
    results.first.wait_for()
    hrefs = results.evaluate_all("links => links.map(a => a.href)")
    assert any("/ch4/" in h for h in hrefs), f"搜索'页表'没有找到第 4 章：{hrefs}"


def test_palette_toggle_switches_to_dark(page):
    page.goto(page.base_url + "/ch1/", wait_until="networkidle")
    before = page.locator("body").get_attribute("data-md-color-scheme")
    page.locator("label.md-header__button[for^='__palette']:visible").first.click()
    after = page.locator("body").get_attribute("data-md-color-scheme")
    assert {before, after} == {"default", "slate"}, (before, after)
    if after != "slate":
        page.locator("label.md-header__button[for^='__palette']:visible").first.click()
    figure = page.locator(".md-content img[src$='.svg']").first
    assert "invert" in figure.evaluate("i => getComputedStyle(i).filter"), "暗色方案下示意图没有反色：还是一张亮卡片"


# 把几个字画进 canvas 比像素：缺字形时每个字都画成同一个 .notdef 方框，和一个未分配码位（U+0378）画出来的一样。
_GLYPHS_JS = """([font, text]) => {
  const draw = (s) => {
    const c = document.createElement('canvas'); c.width = 64; c.height = 64;
    const g = c.getContext('2d'); g.font = font; g.textBaseline = 'top'; g.fillText(s, 4, 4);
    return Array.from(g.getImageData(0, 0, 64, 64).data).join(',');
  };
  const missing = draw('\\u0378');
  return Array.from(text).filter(ch => draw(ch) === missing);
}"""
_CJK_SAMPLE = "页表注意力张量并行"


def _tofu(pg) -> list[str]:
    """页面 h1 的字体下，_CJK_SAMPLE 里画成"缺字方框"的字。"""
    font = pg.locator("h1").first.evaluate("h => { const s = getComputedStyle(h); return `32px ${s.fontFamily}`; }")
    return pg.evaluate(_GLYPHS_JS, [font, _CJK_SAMPLE])


def test_chinese_renders_as_glyphs_not_boxes(page):
    page.goto(page.base_url + "/ch4/", wait_until="networkidle")
    boxes = _tofu(page)
    assert not boxes, (f"这些汉字画出来是缺字方框：{boxes}。系统没有中文字体："
                       "sudo apt-get install -y fonts-noto-cjk（或 fonts-wqy-microhei）")


def test_tofu_check_fails_without_cjk_font(playwright, base_url, tmp_path):
    """上一项检查能失败：只给浏览器一个没有中文的字体目录，同一个检查必须报出每个字。"""
    latin = Path("/usr/share/fonts/truetype/dejavu")
    if not latin.is_dir():
        unavailable(f"没有 {latin}", "sudo apt-get install -y fonts-dejavu-core")
    conf = tmp_path / "fonts.conf"
    conf.write_text(f'<?xml version="1.0"?><fontconfig><dir>{latin}</dir><cachedir>{tmp_path}</cachedir></fontconfig>')
    b = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS,
                                   env=dict(os.environ, FONTCONFIG_FILE=str(conf)))
    try:
        pg = b.new_page()
        pg.goto(base_url + "/ch4/", wait_until="networkidle")
        assert _tofu(pg) == list(_CJK_SAMPLE), "没有中文字体时，缺字检查没有报出方框：检查本身坏了"
    finally:
        b.close()


_OUTPUT_PRE = ".md-content .language-text pre, .md-content div.highlight:not([class*='language-']) pre"
_HIDDEN_VERDICTS_JS = """() => {
  const out = [];
  for (const pre of document.querySelectorAll('.md-content pre')) {
    const box = pre.getBoundingClientRect();
    const walk = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      const i = n.data.indexOf('与 HF 一致');
      if (i < 0) continue;
      const r = document.createRange(); r.setStart(n, i); r.setEnd(n, Math.min(n.data.length, i + 14));
      const rect = r.getBoundingClientRect();
      if (rect.right > box.right + 1 || rect.left < box.left - 1) out.push(n.data.slice(i, i + 20));
    }
  }
  return out;
}"""


def _wide_outputs(pg) -> list[str]:
    return pg.locator(_OUTPUT_PRE).evaluate_all(
        "ps => ps.filter(p => [p, p.querySelector('code') || p].some(e => e.scrollWidth > e.clientWidth + 1))"
        ".map(p => p.innerText.slice(0, 80))")  # Material 让 code 横向滚动，pre 本身不溢出


def test_run_output_wraps_so_verdicts_stay_visible(page):
    page.goto(page.base_url + "/milestone/", wait_until="networkidle")
    outputs = page.locator(_OUTPUT_PRE, has_text="与 HF 一致")
    assert outputs.count() >= 1, "里程碑页没有带'与 HF 一致'的运行输出"
    assert not _wide_outputs(page), f"运行输出有行超出了代码框（要横向滚动才看得见）：{_wide_outputs(page)}"
    assert not page.evaluate(_HIDDEN_VERDICTS_JS), "这些结论行在代码框外面，看不见"
    # 输出以后变短也要守住：往输出末尾接一行远超框宽的结论，它也得折进框里（没有折行的 CSS 时这里失败）
    outputs.last.locator("code").evaluate("c => c.append('\\n' + '很长的一行输出 '.repeat(40) + ' 与 HF 一致: True')")
    assert not _wide_outputs(page) and not page.evaluate(_HIDDEN_VERDICTS_JS), "超长的输出行没有折行，结论看不见"


def _nav_pages() -> list[str]:
    """mkdocs.yml 的 nav 里每一页的地址（index.md -> /，ch4.md -> /ch4/）。"""
    pages = re.findall(r"^\s*- [^:]+:\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert len(pages) >= 10, f"没从 mkdocs.yml 读出 nav：{pages}"
    return ["/" if p == "index.md" else "/" + p[:-3] + "/" for p in pages]


def test_every_page_images_load(page):
    total = 0
    for url in _nav_pages():
        page.goto(page.base_url + url, wait_until="networkidle")  # 等搜索的 worker 也加载完，换页时不中断它
        imgs = page.locator(".md-content img")
        broken = imgs.evaluate_all("is => is.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
        assert not broken, f"{url} 上这些图片没有加载出来：{broken}"
        total += imgs.count()
    assert total >= 15, f"整本书只找到 {total} 张图"


def test_build_makes_the_tiny_models_first(monkeypatch):
    """刚克隆的仓库没有 models/tiny/：mkdocs 的 on_pre_build 钩子要先生成它们，页面里的 run(...) 才跑得起来。"""
    from tools.book import mkdocs_hooks
    from tools.models import make_tiny_models

    calls = []
    monkeypatch.setattr(make_tiny_models, "make_all", lambda *a, **k: calls.append(a) or {})
    mkdocs_hooks.on_pre_build(None)
    assert calls, "mkdocs 钩子没有在构建前生成小模型：刚克隆时 mkdocs build / serve 会找不到 models/tiny/"
