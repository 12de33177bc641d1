"""查报错的唯一入口：测试只通过这里查异常类型和报错消息，清单在 tests/chN/errors.toml（读法见 book/error_cases.py）。

    with expect_error("ch3/no_weights", path=str(path)):       # 进程内：异常类型 + 每个片段
        stream(path, model)
    expect_exit("ch4/pool_too_small", res)                      # 命令行：非 0 退出、最后一行、没有 Traceback

失败时只有一行，就是进度表里那一行原因：类型不对是"期望 ValueError（match=…），得到 KeyError: …"，
缺片段是"ValueError 的消息里没有 '…'"。碰到桩（NotImplementedError）原样抛出，进度表写的就是桩的任务号。
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

from tools.book.error_cases import Case, case, contains


class ErrorCaseFailure(AssertionError):
    """报错和清单对不上。消息只有一行。"""


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "…"


def _first(values: dict) -> dict:
    """one_of 的第一组并进来：说"期望什么"时用它。"""
    alternatives = values.get("one_of") or [{}]
    return {**{k: v for k, v in values.items() if k != "one_of"}, **alternatives[0]}


def _expected(c: Case, values: dict) -> str:
    match = "、".join(repr(f) for f in c.fragments(_first(values)))
    return f"期望 {c.label}" + (f"（match={match}）" if match else "")


def check_message(c: Case, text: str, values: dict, what: str) -> None:
    """每个必须的片段单独查、点名；再查不许出现的片段。what 是"ValueError 的消息""stderr 最后一行"这样的说法。

    values 里的 one_of=[{...}, {...}] 是几组都算对的回显（比如几个张量里先报哪个都行）：有一组全对就行。"""
    alternatives = values.pop("one_of", None)
    if alternatives:
        failures = []
        for alt in alternatives:
            try:
                return check_message(c, text, {**values, **alt}, what)
            except ErrorCaseFailure as e:
                failures.append(str(e))
        raise ErrorCaseFailure(failures[0] + (f"（另外 {len(failures) - 1} 组可接受的也都对不上）"
                                              if len(failures) > 1 else ""))
    for frag in c.fragments(values):
        if not contains(c, text, frag):
            raise ErrorCaseFailure(f"{what}里没有 {frag!r}：{_short(text)}")
    for frag in c.fragments(values, "absent"):
        if contains(c, text, frag):
            shown = "换行" if frag == "\n" else repr(frag)
            raise ErrorCaseFailure(f"{what}里不该有 {shown}：{_short(text)}")


def check_error(case_id: str, exc: BaseException | None, **values) -> None:
    """exc 是捕获到的异常（没抛时是 None）：类型是清单里的，消息含有每个片段。"""
    c = case(case_id)
    if exc is None:
        raise ErrorCaseFailure(f"{_expected(c, values)}，没有抛出异常")
    if isinstance(exc, NotImplementedError) and "NotImplementedError" not in c.raises:
        raise exc  # 还是桩：原样抛出，进度表写的就是桩的任务号
    names = {t.__name__ for t in type(exc).__mro__}
    if not names & set(c.raises):
        got = f"{type(exc).__name__}: {_short(str(exc), 120)}"
        raise ErrorCaseFailure(f"{_expected(c, values)}，得到 {got}") from exc
    check_message(c, str(exc), values, f"{type(exc).__name__} 的消息")


class Caught:
    """expect_error 给出的对象：退出 with 之后 .value 是捕获到的异常。"""

    value: BaseException | None = None


@contextlib.contextmanager
def expect_error(case_id: str, **values):
    """with 块里必须抛出清单里这一条的异常（或它的子类），消息含有每个片段。"""
    caught = Caught()
    case(case_id)  # id 写错了先说
    try:
        yield caught
    except Exception as exc:  # noqa: BLE001 —— 类型不对也要说清楚期望的是什么
        caught.value = exc
        check_error(case_id, exc, **values)
        return
    check_error(case_id, None, **values)


def expect_exit(case_id: str, res: subprocess.CompletedProcess, **values) -> str:
    """命令行的报错：非 0 退出，stderr 没有 Traceback，最后一行以 错误： 开头（命令行解析的错误是 argparse 的
    error: …），片段都在这一行里。case_id 也可以是一条进程内的报错（比如 ch3/pickle_only）：入口脚本接住那个异常，
    把同一句消息写成 错误：… 这一行。返回这一行。"""
    c = case(case_id)
    err = res.stderr or ""
    stub = re.search(r"NotImplementedError: (第 \d+ 章 · 任务 \d+：[^\n'\"]*)", err)
    if stub:  # 子进程里碰到了桩
        raise NotImplementedError(stub.group(1))
    if res.returncode == 0:
        raise ErrorCaseFailure(f"{_expected(c, values).replace('期望 ' + c.label, '期望非 0 退出')}，却正常退出："
                               f"{_short(res.stdout or '')}")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if "Traceback" in err:
        raise ErrorCaseFailure(f"stderr 里有 Traceback：{_short(lines[-1])}")
    line = lines[-1] if lines else ""
    if c.argparse:  # argparse 默认写 prog: error: …；第 6 章的解析器改写成一行 错误：…
        if "error:" not in line and not line.startswith("错误："):
            raise ErrorCaseFailure(f"stderr 最后一行不是命令行解析的 error: …：{_short(line)}")
    elif not line.startswith("错误："):
        raise ErrorCaseFailure(f"stderr 最后一行不以 '错误：' 开头：{_short(line)}")
    check_message(c, line, values, "stderr 最后一行")
    return line


def run_cli(entry: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """在当前进程里按 __main__ 运行入口脚本（省掉起进程、import torch 的几秒），结果和子进程一样交给 expect_exit：
    sys.exit("错误：…") 的消息进 stderr；漏出来的异常写成 Traceback，和真的子进程一样。跑完清掉 minisgl 的全局状态。"""
    out, err = io.StringIO(), io.StringIO()
    old_argv, code = sys.argv, 0
    sys.argv = [str(entry), *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(entry), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):
            err.write(e.code + "\n")
            code = 1
        else:
            code = e.code or 0
    except Exception:  # noqa: BLE001 —— 子进程里它会打印 Traceback、以 1 退出
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv = old_argv
        _reset_minisgl_globals()
    return subprocess.CompletedProcess([str(entry), *argv], code, out.getvalue(), err.getvalue())


def _reset_minisgl_globals() -> None:
    """出错时入口脚本可能没来得及清理全局 Context 和 TP 身份（子进程里进程一退出就没了）：这里清掉，后面的测试不受影响。
    只清已经 import 了的（第 0 步没有 minisgl，第 1 章还没有 TP 身份）。"""
    for module, reset in (("minisgl.core", "reset_global_ctx"), ("minisgl.distributed", "reset_tp_info")):
        fn = getattr(sys.modules.get(module), reset, None)
        if fn is not None:
            fn()
