"""本书的源文件（docs/*.md）不会和代码脱节：

- 每章的页面按同一个模板排二级标题，本章检查点一节用构建时现算的 diff；
- 书里写的每条测试命令都真的能跑：tools.run_tests 的参数用它自己的解析器核对，检查点名字查清单，
  pytest 的 -k 关键字必须选得到这一章（累积）的测试；
- 每一页"任务"一节的小标题和 tests/tasks.toml 的任务一一对应；每个测试从 minisgl import 的名字，
  这一章的页面上（或者构建时生成的接口表里）都写得出来；
- 页面上没有手抄的代码：python 代码块只能是 snippets 的 include（少数白名单里的示意片段要逐行出现在源文件里），
  任何代码块里都不能有连续 3 行非空行和某个检查点文件里的连续 3 行相同。
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tools.manifest import by_name, load_manifest
from tools.manifest import load_tasks
from tools.workbench import stubs
from tools.run_tests import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

TEMPLATE = ["学习目标", "动手前先预测", "任务", "运行本章测试", "自测题", "练习", "本章检查点", "对照官方实现",
            "延伸阅读"]
PYTHON_LANGS = {"python", "py", "python3", "pycon"}
SNIPPET = re.compile(r'^--8<-- "[^"]+"$')
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)(.*)$")

# 允许不经 include 出现在页面上的 python 代码块：(页面, 代码块第一行) -> (它示意的源文件, 理由)。
# 这些块的每一行都必须原样出现在那个源文件里，源文件一改，测试就提醒你改页面。
ALLOWED_PYTHON = {
    ("ch3.md", 'with torch.device("meta"), torch_dtype(dtype):'):
        ("ch3_model_loading/generate.py", "两行示意 meta 上构造的写法；完整的 load_model 在本章检查点一节里 include"),
}


def _pages() -> list[Path]:
    """书的页面；docs/snippets/ 里是被 include 的片段（mkdocs.yml 的 exclude_docs），不算页面。"""
    return sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] != "snippets")


def _blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(起始行号, 语言, 内容行)；认得 admonition 里缩进的代码块。"""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.group(1), m.group(2), m.group(3).lower()
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != ticks:
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        out.append((i + 1, lang, body))
        i = j + 1
    return out


def _headings(text: str, level: int = 2) -> list[str]:
    """正文里（代码块之外）的某一级标题。"""
    heads, fenced = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and fenced is None:
            fenced = m.group(2)
        elif fenced is not None and line.strip() == fenced:
            fenced = None
        elif fenced is None and line.startswith("#" * level + " "):
            heads.append(line[level + 1:].strip())
    return heads


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"没有 '## {title}' 一节"
    return m.group(1)


def _chapters() -> list:
    return [c for c in load_manifest() if c.chapter >= 1]


@pytest.mark.parametrize("ck", _chapters(), ids=lambda c: c.name)
def test_chapter_page_follows_the_template(ck):
    page = DOCS / f"ch{ck.chapter}.md"
    text = page.read_text(encoding="utf-8")
    assert _headings(text, 1)[0].startswith(f"第 {ck.chapter} 章"), \
        f"{page.name} 的一级标题要以'第 {ck.chapter} 章'开头"
    assert _headings(text) == TEMPLATE, f"{page.name} 的二级标题应该依次是 {TEMPLATE}，现在是 {_headings(text)}"
    assert f'{{{{ chapter_diff("{ck.name}") }}}}' in _section(text, "本章检查点"), \
        f"{page.name} 的'本章检查点'要用构建时现算的 {{{{ chapter_diff(\"{ck.name}\") }}}}"
    quiz = _section(text, "自测题")
    questions = re.findall(r"^\d+\. ", quiz, re.M)
    answers = re.findall(r'^\s+\?\?\? success "答案"$', quiz, re.M)
    assert questions and len(questions) == len(answers), \
        f"{page.name} 的自测题有 {len(questions)} 道，折叠的答案（??? success \"答案\"）有 {len(answers)} 个"
    assert "官方" in _section(text, "对照官方实现") and "python/minisgl/" in _section(text, "对照官方实现"), \
        f"{page.name} 的'对照官方实现'要写出对应的官方文件"


def _page_of(ck) -> Path:
    return DOCS / ("step0.md" if ck.chapter == 0 else f"ch{ck.chapter}.md")


@pytest.mark.parametrize("ck", load_manifest(), ids=lambda c: c.name)
def test_task_headings_match_tasks_toml(ck):
    """python course.py check 的进度表和接口表按 tasks.toml 的任务号分组：页面上的任务要是同一份清单。"""
    text = _page_of(ck).read_text(encoding="utf-8")
    assert "<!-- 接口 -->" in _section(text, "任务").split("\n###", 1)[0], \
        f"{_page_of(ck).name}：'## 任务' 下面第一段要有 <!-- 接口 -->（构建时换成接口表）"
    heads = [h.replace("`", "") for h in _headings(_section(text, "任务"), 3) if h.startswith("任务 ")]
    want = [f"任务 {t.number} · {t.title.replace('`', '')}" for t in load_tasks()[ck.chapter]]
    got = [next((h for h in heads if h.startswith(w)), None) for w in want]
    assert None not in got and len(heads) == len(want), \
        f"{_page_of(ck).name} 的任务小标题要依次以 {want} 开头（见 tests/tasks.toml），现在是 {heads}"
    assert got == heads, f"{_page_of(ck).name} 的任务顺序和 tests/tasks.toml 不同：{heads}"


def _module_exists(ck, module: str) -> bool:
    rel = Path(*module.split("."))
    return (ck.path / rel).with_suffix(".py").is_file() or (ck.path / rel / "__init__.py").is_file()


def _imported_names(chapter: int) -> dict[str, str]:
    """tests/chN/*.py 里 from minisgl... import 的名字 -> 第一次出现的文件。
    只算这一章已经有的模块：累积测试里给后面几章准备的 import（比如第 4 章的测试在第 5 章起才建注意力后端）不算。"""
    ck = next(c for c in _chapters() if c.chapter == chapter)
    names: dict[str, str] = {}
    for f in sorted((ROOT / "tests" / f"ch{chapter}").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "minisgl"
                    and _module_exists(ck, node.module)):
                for alias in node.names:
                    names.setdefault(alias.name, f.name)
    return names


def _missing_names(names: dict[str, str], text: str) -> list[str]:
    return sorted(n for n in names if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text))


@pytest.mark.parametrize("ck", _chapters(), ids=lambda c: c.name)
def test_every_name_the_tests_import_is_on_the_page(ck):
    """测试 import 的名字就是这一章对读者的约定：这一章或前面几章的页面正文、接口表里要写到它（累积：
    第 1 章讲过的 reset_global_ctx，第 6 章的测试再 import 也不用重讲）。"""
    names = _imported_names(ck.chapter)
    assert names, f"tests/ch{ck.chapter}/ 里没有从 minisgl import 任何名字：这个检查查不到东西"
    text = "\n".join(_page_of(c).read_text(encoding="utf-8") + "\n" + stubs.interface_table(c)
                      for c in _chapters() if c.chapter <= ck.chapter)
    missing = _missing_names(names, text)
    assert not missing, (f"{_page_of(ck).name}：tests/ch{ck.chapter}/ 从 minisgl import 了 "
                         f"{[f'{n}（{names[n]}）' for n in missing]}，第 1~{ck.chapter} 章的页面和接口表里都没写到")


def test_import_check_catches_a_missing_name():
    """自检：页面上删掉一个名字，上面的检查必须报出它。"""
    names = _imported_names(1)
    text = (DOCS / "ch1.md").read_text(encoding="utf-8") + "\n" + stubs.interface_table(_chapters()[0])
    assert "SamplingParams" in names and "SamplingParams" not in _missing_names(names, text)
    assert "SamplingParams" in _missing_names(names, text.replace("SamplingParams", "SamplingParamsX"))


def test_chapter4_exercise_is_page_size_4():
    assert "--page-size 4" in _section((DOCS / "ch4.md").read_text(encoding="utf-8"), "练习")


def _commands(text: str) -> list[str]:
    """代码块里的命令行（去掉行尾注释，拼上续行）。"""
    cmds = []
    for _, lang, body in _blocks(text):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        joined = "\n".join(body).replace("\\\n", " ")
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                cmds.append(line)
    return cmds


def _test_names(chapter: int) -> str:
    """这一章的检查点会跑到的全部测试：文件名和函数名（-k 就在这些名字里做子串匹配）。"""
    dirs = ["checkpoint"] + [f"ch{n}" for n in range(1, chapter + 1)]
    names = []
    for d in dirs:
        for f in sorted((ROOT / "tests" / d).glob("test_*.py")):
            names.append(f.stem)
            names += re.findall(r"^def (test_\w+)", f.read_text(encoding="utf-8"), re.M)
    return "\n".join(names)


def _check_command(cmd: str) -> None:
    argv = cmd.split()
    if argv[:3] == ["python", "-m", "tools.run_tests"]:
        try:
            args, extra = build_parser().parse_known_args(argv[3:])
        except SystemExit:
            pytest.fail(f"tools.run_tests 不认这条命令：{cmd}")
        assert not [e for e in extra if e.startswith("-")], f"tools.run_tests 不认这些参数：{extra}（{cmd}）"
        if args.checkpoint:
            spec = args.as_chapter if args.as_chapter else args.checkpoint
            assert by_name(spec), f"{cmd}：清单里没有检查点 {spec!r}"
    elif argv[:4] == ["python", "-m", "pytest", "tests"]:
        opts = dict(zip(argv[4::2], argv[5::2]))
        spec = opts.get("--as") or opts.get("--checkpoint")
        ck = by_name(spec) if spec else None
        assert ck, f"{cmd}：--checkpoint / --as 要指向清单里的检查点"
        if "-k" in opts:
            names = _test_names(ck.chapter)
            for word in re.findall(r"\w+", opts["-k"]):
                if word not in ("and", "or", "not"):
                    assert word in names, f"{cmd}：-k {word} 在第 {ck.chapter} 章会跑的测试里一个也选不到"
    elif argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith("tools."):
        module = ROOT.joinpath(*argv[2].split("."))  # 模块 tools/x.py，或者包 tools/x/（有 __main__.py）
        assert module.with_suffix(".py").is_file() or (module / "__main__.py").is_file(), f"{cmd}：没有这个工具"
    elif len(argv) > 1 and argv[0] == "python" and argv[1].endswith(".py") and not argv[1].split("/")[0].isupper():
        assert (ROOT / argv[1]).is_file(), f"{cmd}：没有 {argv[1]}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_every_command_on_the_page_is_runnable(page):
    for cmd in _commands(page.read_text(encoding="utf-8")):
        _check_command(cmd)


def test_command_check_catches_a_missing_tool():
    """python -m tools.X 的 X 必须是 tools/ 里真有的模块（工具改名后书里的命令跟着改）。"""
    _check_command("python -m tools.book.make_figures")
    with pytest.raises(AssertionError, match="tools.no_such_tool"):
        _check_command("python -m tools.no_such_tool --flag")


@pytest.mark.parametrize("ck", _chapters(), ids=lambda c: c.name)
def test_chapter_page_has_its_test_command(ck):
    cmds = _commands(_section((DOCS / f"ch{ck.chapter}.md").read_text(encoding="utf-8"), "运行本章测试"))
    ours = [c for c in cmds if c.split()[:3] == ["python", "-m", "tools.run_tests"] and len(c.split()) == 4]
    assert any(getattr(by_name(c.split()[3]), "name", None) == ck.name for c in ours), \
        f"ch{ck.chapter}.md 的'运行本章测试'里要有 python -m tools.run_tests ch{ck.chapter}"


def _triples(lines: list[str]) -> set[tuple[str, str, str]]:
    code = [ln.strip() for ln in lines if ln.strip()]
    return {tuple(code[i:i + 3]) for i in range(len(code) - 2)}


@pytest.fixture(scope="module")
def checkpoint_triples() -> dict[tuple[str, str, str], str]:
    """每个检查点里每个 .py 文件的"连续 3 行非空行" -> 文件名。"""
    seen: dict[tuple[str, str, str], str] = {}
    for ck in load_manifest():
        for f in sorted(ck.path.rglob("*.py")):
            for t in _triples(f.read_text(encoding="utf-8").splitlines()):
                seen.setdefault(t, str(f.relative_to(ROOT)))
    return seen


def test_pasted_code_detector_catches_a_pasted_function(checkpoint_triples):
    """自检：从检查点里抄一段代码，检测器必须认出来。"""
    src = (ROOT / "ch4_kv_pool" / "minisgl" / "kvcache" / "mha_pool.py").read_text(encoding="utf-8").splitlines()
    body = [ln for ln in src if ln.strip()][10:16]
    assert _triples(body) & checkpoint_triples.keys()


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_no_hand_pasted_code(page, checkpoint_triples):
    rel = page.relative_to(DOCS).as_posix()
    for lineno, lang, body in _blocks(page.read_text(encoding="utf-8")):
        content = [ln for ln in body if ln.strip()]
        includes_only = all(SNIPPET.match(ln.strip()) for ln in content)
        if lang in PYTHON_LANGS and not includes_only:
            key = (rel, content[0].strip() if content else "")
            assert key in ALLOWED_PYTHON, (
                f"{rel}:{lineno}：python 代码块要用 --8<-- 从检查点文件 include，不能手抄"
                f"（确实只是示意的话，加进 tests/repo/test_docs.py 的 ALLOWED_PYTHON 并写明理由）")
            key_src = ALLOWED_PYTHON[key][0]
            source = (ROOT / key_src).read_text(encoding="utf-8")
            for ln in content:
                assert ln.strip() in source, f"{rel}:{lineno}：示意片段的 {ln.strip()!r} 在 {key_src} 里已经没有了"
            continue
        pasted = _triples([ln for ln in body if not SNIPPET.match(ln.strip())]) & checkpoint_triples.keys()
        first = next(iter(pasted), None)
        assert not pasted, (f"{rel}:{lineno}：这个代码块里有从 {checkpoint_triples.get(first)} 抄来的连续几行："
                            f"{first}；用 --8<-- include（可以用命名片段）")


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    in_nav = set(re.findall(r":\s*(\S+\.md)\s*$", nav, re.M))
    missing = [p.relative_to(DOCS).as_posix() for p in _pages() if p.relative_to(DOCS).as_posix() not in in_nav]
    assert not missing, f"这些页面不在 mkdocs.yml 的 nav 里，读者找不到：{missing}"


def test_milestone_keeps_the_measured_section():
    """CPU 上的实测一节放 tools/bench 写出的表格，不手写数字。"""
    assert "CPU 上的实测" in _headings((DOCS / "milestone.md").read_text(encoding="utf-8"))


def _ch3_task(number: int) -> str:
    text = _section((DOCS / "ch3.md").read_text(encoding="utf-8"), "任务")
    return re.search(rf"^### 任务 {number} · .*?(?=^### |\Z)", text, re.M | re.S).group(0)


def _function(rel: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((ROOT / "ch3_model_loading" / rel).read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_weight_docstring_and_the_page_agree_on_pending_groups():
    """load_weight 的 pending 按合并后的名字放几组、读完全部文件才查空：分片的检查点里会同时有几组。
    weight.py 的模块 docstring 和第 3 章页面（任务 7；自测题 3 的答案）都这么说，不说"一组"。"""
    fn = _function("minisgl/models/weight.py", "load_weight")
    keyed = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "pending.setdefault"]
    assert keyed and ast.unparse(keyed[0].args[0]) == "name", "pending 不再按名字放几组：改 docstring 和页面"
    doc = ast.get_docstring(ast.parse((ROOT / "ch3_model_loading/minisgl/models/weight.py").read_text("utf-8")))
    page = (DOCS / "ch3.md").read_text(encoding="utf-8")
    assert "同时有几组" in doc and "同时有几组" in _ch3_task(7), doc
    assert "好几组" in _section(page, "动手前先预测"), "自测题 3 的答案"


def test_ch3_page_says_what_get_model_class_returns():
    """名字说"类"、注解说 BaseLLMModel：代码 return 的是 类(model_config)，页面点名它的那句要说返回实例、不是类。"""
    fn = _function("minisgl/models/register.py", "get_model_class")
    returned = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
    assert len(returned) == 1 and isinstance(returned[0], ast.Call) and ast.unparse(returned[0].args[0]) == \
        "model_config", "get_model_class 不再返回实例：改第 3 章任务 2 的那句"
    text = _ch3_task(2).replace("\n", "")
    sentence = text[text.index("`get_model_class("):].split("。")[0]
    assert "实例" in sentence and "不是类" in sentence, sentence
