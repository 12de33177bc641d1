"""每一章的报错清单：tests/chN/errors.toml（命令行契约在 tests/checkpoint/errors.toml，算第 0 章）。

一条报错：id、任务号、情形（页面上那一行）、异常类型、消息必须含有的片段，可选地列出不许出现的片段。
片段里的 {名字} 是测试自己的输入（路径、值）回显在报错里的部分：测试给出它的值，页面上写成清单 [echo] 表里的词。
测试经 tests/harness/errors.py 的 expect_error / expect_exit 查报错；页面上的 {{ errors("ch3", 6) }}
由 tools/book/mkdocs_hooks.py 换成这一章任务 6 的报错表（原文件里占位符下面跟一行 source_note，构建时一起换掉）。
两边读的是同一份清单，所以页面和测试不会说两样话。
"""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from tools.manifest import ROOT, tomllib

PLACEHOLDER = re.compile(r"\{(\w+)\}")
EXIT = "SystemExit"  # 命令行的报错：sys.exit("错误：…")，或者命令行解析（argparse）的 error: …


@dataclass(frozen=True)
class Case:
    id: str  # "ch3/no_weights"
    chapter: int
    task: int
    when: str  # 情形，页面上那一行（Markdown）
    raises: tuple[str, ...]  # 异常类名（几个都可以时列出几个）；"SystemExit" 表示命令行退出
    message: tuple[str, ...] = ()  # 必须含有的片段
    absent: tuple[str, ...] = ()  # 不许出现的片段
    argparse: bool = False  # 命令行解析报的错：最后一行是 argparse 的 error: …，不是 错误：…
    words: bool = False  # 片段要是独立的词："prefill" 里的 fi 不算 fi
    echo: dict = field(default_factory=dict, compare=False, hash=False)  # 占位符 -> 页面上的词

    @property
    def label(self) -> str:
        return " 或 ".join(self.raises)

    def fragments(self, values: dict, which: str = "message") -> list[str]:
        """把占位符换成测试给的值；测试没给的占位符是测试写错了。整个片段就是一个占位符、值是列表时
        （比如剩下的每一个键），列表里的每一项各是一个片段。"""
        out = []
        for frag in getattr(self, which):
            missing = [n for n in PLACEHOLDER.findall(frag) if n not in values]
            if missing:
                raise TypeError(f"{self.id}：片段 {frag!r} 要测试给出 {'、'.join(missing)}")
            whole = PLACEHOLDER.fullmatch(frag)
            if whole and isinstance(values[whole.group(1)], (list, tuple)):
                out += [str(v) for v in values[whole.group(1)]]
            else:
                out.append(PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), frag))
        return out


def contains(c: Case, text: str, frag: str) -> bool:
    """text 里有没有 frag；c.words 时要求前后不是字母、数字、下划线。"""
    if not c.words:
        return frag in text
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(frag)}(?![A-Za-z0-9_])", text) is not None


def data_file(folder: str) -> Path:
    return ROOT / "tests" / folder / "errors.toml"


def chapter_of(folder: str) -> int:
    return 0 if folder == "checkpoint" else int(folder.removeprefix("ch"))


def folders() -> list[str]:
    """有报错清单的测试目录：ch1 … ch6、checkpoint。"""
    return sorted(p.parent.name for p in (ROOT / "tests").glob("*/errors.toml"))


@functools.cache
def load(folder: str) -> dict[str, Case]:
    """tests/<folder>/errors.toml 的全部报错，按 id（"<folder>/<名字>"），保持文件里的顺序。"""
    data = tomllib.loads(data_file(folder).read_text(encoding="utf-8"))
    echo = data.get("echo", {})
    out: dict[str, Case] = {}
    for c in data.get("case", []):
        raises = c["raises"] if isinstance(c["raises"], list) else [c["raises"]]
        item = Case(id=f"{folder}/{c['id']}", chapter=chapter_of(folder), task=c["task"], when=c["when"],
                    raises=tuple(raises), message=tuple(c.get("message", [])), absent=tuple(c.get("absent", [])),
                    argparse=c.get("argparse", False), words=c.get("words", False), echo=echo)
        if item.id in out:
            raise ValueError(f"{data_file(folder)}：id {c['id']!r} 出现了两次")
        out[item.id] = item
    return out


def case(case_id: str) -> Case:
    folder = case_id.split("/")[0]
    cases = load(folder)
    if case_id not in cases:
        raise KeyError(f"tests/{folder}/errors.toml 里没有 {case_id!r}")
    return cases[case_id]


# ---------------------------------------------------------------- 页面上的报错表

def _code(text: str) -> str:
    """行内代码；片段里有反引号时用双反引号包起来。"""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _spaced(word: str) -> bool:
    return re.search(r"\s", word) is not None


def render_fragment(c: Case, frag: str) -> str:
    """片段写成行内代码，占位符写成 {页面上的词}；整个片段就是一个占位符时只写 {那个词}，不用代码体。
    代码体里的词带空格时改写清单里的 {名字}，表下面一行说它是什么（name_note）：代码体里看得见的每个空格
    都是消息里真有的（"{key}（引擎里的 {engine}）"的那个空格）。"""
    if frag == "\n":
        return "换行"
    whole = PLACEHOLDER.fullmatch(frag)
    if whole:
        return "{" + c.echo[whole.group(1)] + "}"
    return _code(PLACEHOLDER.sub(lambda m: "{" + (m.group(1) if _spaced(c.echo[m.group(1)]) else c.echo[m.group(1)])
                                 + "}", frag))


def render_raises(c: Case) -> str:
    if c.raises == (EXIT,):
        if c.argparse:
            return "非 0 退出，最后一行是命令行解析的 `error: …`（第 6 章起 `错误：…`）"
        return "非 0 退出，最后一行 `错误：…`"
    return " 或 ".join(f"`{r}`" for r in c.raises)


ECHO_NOTE = "表里的 {{…}} 不是照抄的字，是测试的输入在消息里的回显：比如 {{{example}}} 处写出测试给的那个值。"


def name_note(rows: list[Case]) -> str:
    """代码体里写成 {名字} 的占位符（页面上的词带空格）各是什么；没有时是空字符串。"""
    names: dict[str, str] = {}
    for c in rows:
        for f in (*c.message, *c.absent):
            if not PLACEHOLDER.fullmatch(f):
                names.update((n, c.echo[n]) for n in PLACEHOLDER.findall(f) if _spaced(c.echo[n]))
    if not names:
        return ""
    listed = "；".join(f"`{{{n}}}`：{word}" for n, word in names.items())
    return f"代码体里的 {listed}。代码体里看得见的每个空格都是消息里真有的一个空格，照抄。"
SOURCE_NOTE = "> 这里是一张报错表，只在构建好的书里显示"


def source_note(folder: str, page: str, task: int | None = None) -> str:
    """docs/chN.md 里每个 {{ errors(…) }} 下面紧跟的一行：在代码托管网站、编辑器里读原文件的人只看得到占位符，
    这一行告诉他表在哪里：同一份清单生成、提交在仓库里的 tests/<folder>/errors.md（tables_file），或者构建好的书。
    构建时它和占位符一起换成表（tools/book/mkdocs_hooks.py），书里不出现。"""
    anchor = f"#任务-{task}" if task is not None else ""
    return (f"{SOURCE_NOTE}；读原文件时看 [tests/{folder}/errors.md](../tests/{folder}/errors.md{anchor})"
            f"（同一份清单 `tests/{folder}/errors.toml` 生成的同样的表），"
            f"或者在仓库根目录运行 `.venv/bin/mkdocs serve`，"
            f"浏览器打开 http://127.0.0.1:8000/{page}/ 。")


def tables_file(folder: str) -> Path:
    """提交在仓库里的报错表：给读原文件的人（页面上的占位符只在构建时换成表）。"""
    return ROOT / "tests" / folder / "errors.md"


def render_file(folder: str) -> str:
    """tests/<folder>/errors.md 的内容：这一章每个任务一张表（命令行契约一张）。"""
    from tools.manifest import load_tasks

    head = [f"# {'命令行契约' if folder == 'checkpoint' else f'第 {chapter_of(folder)} 章'}的报错表", "",
            f"由 `tests/{folder}/errors.toml` 生成（`python -m tools.book.error_cases` 重写；"
            "`tests/repo/test_error_cases.py` 查它和清单一致），和书里页面上的表是同一份。测试查的就是这些片段。", ""]
    if folder == "checkpoint":
        return "\n".join(head + [render_table(folder), ""])
    titles = {t.number: t.title for t in load_tasks().get(chapter_of(folder), [])}
    tasks = sorted({c.task for c in load(folder).values()})
    body = [f"## 任务 {k}\n\n{titles.get(k, '')}\n\n{render_table(folder, k)}\n" for k in tasks]
    return "\n".join(head + body)


def write_files() -> list[Path]:
    """重写每一章的 tests/<folder>/errors.md；返回改了的文件。"""
    changed = []
    for folder in folders():
        path, text = tables_file(folder), render_file(folder)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed



def render_table(folder: str, task: int | None = None) -> str:
    """一章（一个任务）的报错表：情形、异常、消息里要有（和不许有）的片段。"""
    rows = [c for c in load(folder).values() if task is None or c.task == task]
    if not rows:
        raise ValueError(f"tests/{folder}/errors.toml 里没有任务 {task} 的报错")
    out = ["| 情形 | 异常 | 消息里要有 |", "|---|---|---|"]
    for c in rows:
        need = "、".join(render_fragment(c, f) for f in c.message) or "—"
        if c.words:
            need += "（每个都是独立的词：前后不能紧挨着英文字母、数字或 `_`）"
        if c.absent:
            need += "；不能有 " + "、".join(render_fragment(c, f) for f in c.absent)
        cells = [c.when, render_raises(c), need]
        out.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |")
    shown = [c.echo[m.group(1)] for c in rows for f in (*c.message, *c.absent) for m in PLACEHOLDER.finditer(f)]
    if shown:
        out += ["", ECHO_NOTE.format(example=shown[0])]
    if note := name_note(rows):
        out += ["", note]
    return "\n".join(out)


def main() -> None:
    """python -m tools.book.error_cases：重写过时了的 tests/<folder>/errors.md；没有参数，只认 --help。"""
    argparse.ArgumentParser(description=main.__doc__).parse_args()
    for p in write_files():
        print(f"写了 {p.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
