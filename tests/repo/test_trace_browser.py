"""trace.html 在真的浏览器里（和 tests/repo/test_site.py 同一个 chromium + playwright）：

- 单独打开（file://，不许有任何网络请求）：滑块、上一步 / 下一步、左右方向键换步，每一步显示的数就是记录里的数，
  鼠标停在槽位上说出请求、位置和 token；暗色方案；汉字画成了字；
- --against 的 HTML 停在第一个不同的那一步，红框在你的那一格，虚线框在参考的同一格；
- 嵌在书里（用本书的主题和书的构建钩子构建一页小书）：iframe 按内容撑高，里面一样能换步，跟着书的暗色切换。
控制台有错误就失败。
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.repo.test_site import _CJK_SAMPLE, _GLYPHS_JS, _QuietHandler
from tools.manifest import ROOT
from tools.book.mkdocs_hooks import TRACE
from tools.trace.cli import build_parser, trace

PROMPTS = ["hello world how are you", "你好", "abc"]


def _data(html_text: str) -> dict:
    raw = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', html_text, re.S).group(1)
    return json.loads(raw.replace("<\\/", "</"))


@pytest.fixture(scope="module")
def pages(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """三个 HTML：第 6 章 page_size=4 三个请求；埋了错的第 4 章对照参考；没有池的第 2 章。"""
    d = tmp_path_factory.mktemp("trace")
    common = [a for p in PROMPTS for a in ("--prompt", p)] + ["--max-new-tokens", "4"]
    trace(["ch6", *common, "--model", str(tiny_models["qwen3-tied"]), "--page-size", "4", "-o", str(d / "ch6.html")])
    mine = d / "my_ch4"
    shutil.copytree(ROOT / "ch4_kv_pool", mine, ignore=shutil.ignore_patterns("__pycache__"))
    src = (mine / "generate.py").read_text(encoding="utf-8")
    bad = src.replace("range(div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps))",
                      "range(req.cached_len // ps, req.device_len // ps)")
    assert bad != src
    (mine / "generate.py").write_text(bad, encoding="utf-8")
    _, diff, _ = trace([str(mine), "--as", "ch4", "--against", "ch4", *common, "--model", str(tiny_models["llama3"]),
                        "--page-size", "4", "-o", str(d / "against.html")])
    assert diff is not None
    trace(["ch2", *common, "--model", str(tiny_models["qwen3-tied"]), "-o", str(d / "ch2.html")])
    return {"ch6": d / "ch6.html", "against": d / "against.html", "ch2": d / "ch2.html"}


@pytest.fixture
def open_page(browser):
    """打开一个地址；file:// 以外的请求一律拦下并记为错误。测试结束时断言控制台没有错误。"""
    contexts, errors = [], []

    def go(url: str, **kw):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, **kw)
        contexts.append(context)
        pg = context.new_page()
        pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        pg.on("requestfailed", lambda req: errors.append(f"requestfailed: {req.url} {req.failure}"))
        if url.startswith("file:"):
            pg.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else
                     (errors.append(f"网络请求：{route.request.url}"), route.abort()))
        pg.set_default_timeout(15_000)
        pg.goto(url, wait_until="load")
        return pg

    yield go
    for c in contexts:
        c.close()
    assert not errors, "浏览器控制台有错误：\n" + "\n".join(errors)


def _shown(frame, k: int, after: bool) -> dict:
    """第一个面板里此刻显示的数（按 data-key 读），和记录的同名字段比。"""
    box = frame.locator(".panel").first

    def texts(prefix: str) -> list[str]:
        return box.locator(f'[data-key^="{prefix}:"]').evaluate_all(
            "es => es.filter(e => /^[^:]+:\\d+$/.test(e.dataset.key)).map(e => e.textContent)")
    pre = "after" if after else "req"
    lens = box.locator(f'[data-key^="{pre}:"][data-key$="_len"]').all_text_contents()
    pt = box.locator('[data-key^="pt:"]').evaluate_all(
        "es => es.filter(e => e.dataset.key.split(':').length === 3).map(e => e.textContent)")
    return {"positions": texts("positions"), "input_ids": texts("input_ids"), "out_loc": texts("out_loc"),
            "lens": lens, "pt": pt, "sampled": texts("sampled") if after else []}


def _expected(t: dict, k: int, after: bool) -> dict:
    s = t["steps"][k]
    reqs = s["after"] if after else s["reqs"]
    return {"positions": [str(x) for x in s["positions"]], "input_ids": [str(x) for x in s["input_ids"]],
            "out_loc": [str(x) for x in s["out_loc"]],
            "lens": [str(r[f]) for r in reqs for f in ("cached_len", "device_len", "extend_len")],
            "pt": [str(x) for row in s["page_table"] for x in row],
            "sampled": [str(x) for x in s["sampled"]] if after else []}


def _check_step(frame, t: dict, k: int, after: bool) -> None:
    assert frame.locator("body").get_attribute("data-step") == str(k)
    assert frame.locator("body").get_attribute("data-state") == ("after" if after else "prepared")
    shown, want = _shown(frame, k, after), _expected(t, k, after)
    shown["sampled"] = [re.search(r"\((\d+)\)$", x).group(1) for x in shown["sampled"]]  # 格子写着 "token (id)"
    assert shown == want, f"第 {k + 1} 步（{'前向之后' if after else '准备好'}）显示的和记录的不一样"


def test_standalone_steps_with_keys_slider_and_buttons(open_page, pages):
    t = _data(pages["ch6"].read_text(encoding="utf-8"))["traces"][0]
    pg = open_page(pages["ch6"].as_uri())
    n = len(t["steps"])
    assert n == 4 and pg.locator("#label").inner_text().startswith(f"第 1 / {n} 步 · prefill · ① batch 准备好")
    for i in range(2 * n):  # 右方向键走完全程，每个画面的数都对
        _check_step(pg, t, i // 2, i % 2 == 1)
        pg.keyboard.press("ArrowRight")
    _check_step(pg, t, n - 1, True)  # 到头了不再动
    pg.keyboard.press("ArrowLeft")
    _check_step(pg, t, n - 1, False)
    pg.locator("#slider").focus()
    pg.keyboard.press("Home")  # 滑块自己的按键
    _check_step(pg, t, 0, False)
    pg.locator("#next").click()
    pg.locator("#next").click()
    pg.locator("#next").click()
    _check_step(pg, t, 1, True)
    pg.locator("#prev").click()
    _check_step(pg, t, 1, False)


def test_hovering_a_slot_names_request_position_and_token(open_page, pages):
    t = _data(pages["ch6"].read_text(encoding="utf-8"))["traces"][0]
    pg = open_page(pages["ch6"].as_uri())
    pg.keyboard.press("ArrowRight")
    pg.keyboard.press("ArrowRight")  # 第 2 步 decode 准备好
    s = t["steps"][1]
    slot, uid, p = s["slots"][-1]
    pg.locator(f'.panel [data-slot="{slot}"]').hover()
    tip = pg.locator("#tip")
    req = next(r for r in s["reqs"] if r["uid"] == uid)
    assert tip.is_visible()
    assert f"槽位 {slot} · 第 {slot // s['pool']['page_size']} 页" in tip.inner_text()
    assert f"请求 {uid} · 位置 {p} · token" in tip.inner_text() and f"({req['tokens'][p]})" in tip.inner_text()
    ps, used = s["pool"]["page_size"], set(s["pages"]) | {s["pool"]["dummy_page"]}
    free = next(x for x in range(s["pool"]["num_pages"]) if x not in used)
    pg.locator(f'.panel [data-slot="{free * ps}"]').hover()
    assert tip.inner_text().endswith("空闲")
    own = next((x for x in range(s["pool"]["num_pages"] * ps) if x // ps in s["pages"]
                and x not in {q[0] for q in s["slots"]}), None)  # 页已经分出去、这个槽位还没轮到
    assert own is not None, "3 个请求长 15、3、2，第 2 步时请求 2 的那一页还有空槽位"
    pg.locator(f'.panel [data-slot="{own}"]').hover()
    assert "这一页已经分给请求" in tip.inner_text() and "还没用到" in tip.inner_text()


def test_cjk_renders_and_dark_mode_follows_the_system(open_page, pages):
    pg = open_page(pages["ch6"].as_uri(), color_scheme="dark")
    assert pg.locator("html").get_attribute("data-theme") == "dark"
    bg = pg.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg != "rgb(255, 255, 255)", bg
    font = pg.locator("h1").evaluate("h => `32px ${getComputedStyle(h).fontFamily}`")
    assert not pg.evaluate(_GLYPHS_JS, [font, _CJK_SAMPLE]), "trace 页面的汉字画成了缺字方框"
    light = open_page(pages["ch6"].as_uri(), color_scheme="light")
    assert light.locator("html").get_attribute("data-theme") == "light"


def test_against_page_opens_on_the_divergence(open_page, pages):
    data = _data(pages["against"].read_text(encoding="utf-8"))
    diff = data["diff"]
    pg = open_page(pages["against"].as_uri())
    assert pg.locator("#diff").inner_text().startswith("第一个不同：" + diff["message"])
    assert pg.locator("body").get_attribute("data-step") == str(diff["step"])
    mine, ref = pg.locator(".panel").nth(0), pg.locator(".panel").nth(1)
    assert mine.locator(".diverge").get_attribute("data-key") == diff["key"]
    assert ref.locator(".diverge-ref").get_attribute("data-key") == diff["key"]
    j = int(diff["key"].split(":")[1])
    assert mine.locator(".diverge").inner_text() == str(data["traces"][0]["steps"][0]["out_loc"][j])
    assert pg.locator(".slot.shared").count() > 0, "向下取整后几个位置共用一个槽位，KV 池里应该标出来"
    pg.keyboard.press("ArrowRight")
    assert pg.locator(".diverge").count() == 0  # 只标在那一步
    pg.locator("#jump").click()
    assert pg.locator(".diverge").count() == 1


def test_chapters_without_a_pool_say_so(open_page, pages):
    t = _data(pages["ch2"].read_text(encoding="utf-8"))["traces"][0]
    pg = open_page(pages["ch2"].as_uri())
    box = pg.locator(".panel").first
    assert "第 2 章还没有页表和 KV 池（第 4 章才有）" in box.inner_text()
    assert "第 2 章还没有 out_loc" in box.inner_text() and box.locator("[data-slot]").count() == 0
    pg.keyboard.press("ArrowRight")
    assert box.locator('[data-key="sampled:0"]').inner_text().endswith(f"({t['steps'][0]['sampled'][0]})")
    assert box.locator('[data-key="after:0:device_len"]').inner_text() == str(t["steps"][0]["after"][0]["device_len"])


def test_book_pages_embed_the_traces_the_issue_asks_for():
    """里程碑页：4 个请求、page_size=4；第 4 章：一个请求，page_size 1 和 4 并排。"""
    found = {}
    for page in ("milestone.md", "ch4.md"):
        hits = TRACE.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))
        assert len(hits) == 1, f"docs/{page} 里应该正好有一个 {{{{ trace(...) }}}}"
        ck, args = hits[0]
        found[page] = (ck, build_parser().parse_args([ck, *shlex.split(args)]))
    ck, a = found["milestone.md"]
    assert ck == "ch6_engine_sampler" and a.prompt is None and a.page_size == [4]  # 默认就是里程碑的 4 个提示词
    ck, a = found["ch4.md"]
    assert ck == "ch4_kv_pool" and len(a.prompt) == 1 and a.page_size == [1, 4]


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """一页小书：本书的主题、配色、样式和钩子，页面里一个 {{ trace(...) }}。用 http 提供（和 test_site 一样）。"""
    d = tmp_path_factory.mktemp("book")
    real = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    (d / "docs" / "stylesheets").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "stylesheets" / "extra.css", d / "docs" / "stylesheets" / "extra.css")
    (d / "docs" / "index.md").write_text(
        '# 第 4 章的一次运行\n\n{{ trace("ch4_kv_pool", "--prompt \'hello\' --max-new-tokens 3 '
        '--page-size 1 --page-size 4") }}\n', encoding="utf-8")
    config = {k: real[k] for k in ("site_name", "theme", "extra_css", "markdown_extensions")}
    config.update(docs_dir=str(d / "docs"), strict=True, plugins=[],
                  hooks=[str(ROOT / "tools" / "book" / "mkdocs_hooks.py")])
    (d / "mkdocs.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(d / "mkdocs.yml"),
                          "--site-dir", str(d / "site")], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "构建多花了" in res.stderr, "钩子没有记下 trace 给构建加的时间"
    handler = functools.partial(_QuietHandler, directory=str(d / "site"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", d / "site"
    server.shutdown()
    server.server_close()


def test_trace_works_inside_the_book(open_page, book):
    url, site = book
    t = _data((site / "traces" / "index-1.html").read_text(encoding="utf-8"))["traces"]
    assert [x["page_size"] for x in t] == [1, 4]
    pg = open_page(url + "/")
    frame_el = pg.locator("iframe.trace-embed")
    frame = frame_el.element_handle().content_frame()
    frame.locator(".panel").nth(1).wait_for()
    assert frame.locator(".panel").count() == 2
    h = frame_el.evaluate("f => f.getBoundingClientRect().height")
    inner = frame.locator("html").evaluate("h => h.scrollHeight")
    want = min(inner, round(900 * 0.9))  # 按内容撑高，最多窗口的九成
    assert abs(h - want) <= 4, f"iframe 没有按内容撑高：{h} 对 {want}"
    left, right = (frame.locator(".panel").nth(i).bounding_box() for i in (0, 1))
    assert right["x"] > left["x"] + left["width"] - 1 and abs(right["y"] - left["y"]) < 1, "两种页大小应该并排"
    frame.locator("h1").click()  # 焦点进 iframe，方向键才归它
    pg.keyboard.press("ArrowRight")
    pg.keyboard.press("ArrowRight")
    _check_step(frame, t[0], 1, False)
    font = frame.locator("h1").evaluate("h => `32px ${getComputedStyle(h).fontFamily}`")
    assert not frame.evaluate(_GLYPHS_JS, [font, _CJK_SAMPLE]), "书里的 trace 汉字画成了缺字方框"
    before = frame.locator("html").get_attribute("data-theme")
    pg.locator("label.md-header__button[for^='__palette']:visible").first.click()
    scheme = pg.locator("body").get_attribute("data-md-color-scheme")
    want = "dark" if scheme == "slate" else "light"
    frame.locator(f'html[data-theme="{want}"]').wait_for(state="attached")
    assert before != want, "切换书的配色之后 trace 没有跟着变"


def test_build_cache_key_follows_every_input(tiny_models, tmp_path):
    """构建时的 trace 有缓存：参数、检查点、模型目录里的文件变了，键就得变。"""
    from tools.book.mkdocs_hooks import trace_key

    model = tmp_path / "m"
    shutil.copytree(tiny_models["llama3"], model)
    key = trace_key("ch4_kv_pool", "--page-size 4", model)
    assert key == trace_key("ch4_kv_pool", "--page-size 4", model)
    assert key != trace_key("ch4_kv_pool", "--page-size 1", model)
    assert key != trace_key("ch5_attention", "--page-size 4", model)
    (model / "config.json").write_text((model / "config.json").read_text() + " ", encoding="utf-8")
    assert key != trace_key("ch4_kv_pool", "--page-size 4", model)
