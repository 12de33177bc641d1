"""报错表里的片段读得出空格：代码体里看得见的每个空格都是消息里真有的。

片段里的占位符在代码体里写成页面上的词；词带空格时（"rank 号"）读的人分不清哪个空格是消息里的，
这时写清单里的名字（{rank}），表下面一行说它是什么（tools/book/error_cases.py 的 render_fragment、name_note）。
"""

from __future__ import annotations

import re

import pytest

from tools.book import error_cases


def _mixed(folder: str):
    """(报错, 片段, 渲染出来的代码体)：片段里有字面的字，也有占位符。"""
    for c in error_cases.load(folder).values():
        for frag in (*c.message, *c.absent):
            if error_cases.PLACEHOLDER.search(frag) and not error_cases.PLACEHOLDER.fullmatch(frag):
                yield c, frag, error_cases.render_fragment(c, frag)


@pytest.mark.parametrize("folder", error_cases.folders())
def test_spaces_in_code_spans_are_the_message_spaces(folder):
    for c, frag, shown in _mixed(folder):
        literal = error_cases.PLACEHOLDER.sub("", frag)
        body = re.sub(r"\{[^{}]*\}", "", shown.strip("`").strip())
        assert body == literal, f"{c.id}：{frag!r} 渲染成 {shown}，代码体里多出了不是消息里的字"
        assert shown.count(" ") - (2 if shown.startswith("`` ") else 0) == frag.count(" "), (c.id, shown)


@pytest.mark.parametrize("folder", error_cases.folders())
def test_every_name_in_a_code_span_is_explained_under_the_table(folder):
    for c, frag, shown in _mixed(folder):
        table = error_cases.render_table(folder, c.task)
        for key in error_cases.PLACEHOLDER.findall(frag):
            if f"{{{key}}}" in shown and key != c.echo[key]:
                assert f"`{{{key}}}`：{c.echo[key]}" in table, f"{c.id}：代码体里的 {{{key}}} 在表下面没有说明"


def test_a_spaced_word_is_written_as_its_name():
    """自检：词带空格的占位符在代码体里写名字，不带空格的写词。"""
    c = error_cases.Case(id="chX/x", chapter=1, task=1, when="x", raises=("ValueError",),
                         message=("{key}（引擎里的 {engine}）",), echo={"key": "键名", "engine": "引擎里的 参数名"})
    assert error_cases.render_fragment(c, c.message[0]) == "`{键名}（引擎里的 {engine}）`"
    assert error_cases.name_note([c]) == ("代码体里的 `{engine}`：引擎里的 参数名。"
                                          "代码体里看得见的每个空格都是消息里真有的一个空格，照抄。")
