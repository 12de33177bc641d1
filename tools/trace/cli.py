"""一步一步看引擎的状态：用检查点自己的 generate.py 跑一遍，记下每一步，写成一个离线就能打开的 HTML。

    python course.py trace [CHECKPOINT] [--as chN] [--against REF] [--model DIR] [--prompt TEXT ...]
                           [--max-new-tokens N] [--page-size P ...] [-o FILE]

CHECKPOINT 默认 ch6，也可以是自己的目录（配合 --as chN）。--page-size 给几次就并排几份。
--against REF 在同样的输入上再跑参考检查点，先报出第一个不同的步和字段，HTML 里标出同一处。
记录在检查点的进程里做（tools/trace/record.py），不改章节代码；画图在 tools/trace/html.py。
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.manifest import ROOT, Checkpoint, find_checkpoint

MILESTONE = ROOT / "ch6_engine_sampler" / "examples" / "stage1_milestone.py"


class TraceError(Exception):
    """给读者看的一行错误（前面加"错误："打印），不打印回溯。"""


def milestone_prompts() -> list[str]:
    """里程碑脚本的 4 个提示词（从它的源码里读，不抄一份）。"""
    tree = ast.parse(MILESTONE.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PROMPTS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise TraceError(f"{MILESTONE} 里没有 PROMPTS")


def default_model() -> Path:
    """和演示用同一个模型（tools.models.find.find_model）；退回离线小模型时说为什么。"""
    from tools.models.find import find_model

    choice = find_model(make=True, tiny=True, quiet=True)
    if choice.why_tiny:
        print(f"没有真模型，改用离线小模型：{choice.why_tiny}", file=sys.stderr)
    return choice.path


def check_chapter(ck: Checkpoint, page_sizes: list[int]) -> None:
    """不用模型就能查的：第 0 步没有步可记，第 1~3 章没有分页。"""
    if ck.chapter == 0:
        raise TraceError("第 0 步的骨架没有 Req 和 Batch，没有可以记录的步：从 ch1 起才能 trace")
    if ck.chapter < 4 and page_sizes != [1]:
        raise TraceError(f"--page-size {page_sizes}：第 {ck.chapter} 章还没有分页 KV，只能是 1（分页从第 4 章开始）")


def unsupported(ck: Checkpoint, model: Path) -> str | None:
    """这一章跑不了这个模型时说明原因（第 1、2 章只有 Qwen3）；跑得了时 None。"""
    from tools.models.find import unsupported_reason

    if not (model / "config.json").is_file():
        raise TraceError(f"--model {model}：找不到 {model / 'config.json'}")
    return unsupported_reason(ck, model)


def run_trace(ck: Checkpoint, model: Path, prompts: list[str], max_new_tokens: int, page_size: int,
              share: int = 1) -> dict:
    """在检查点自己的进程里跑它的 generate.py，返回每一步的记录（出错时 error 说明原因，已走完的步保留）。"""
    gen = ["--model", str(model), *[a for p in prompts for a in ("--prompt", p)],
           "--max-new-tokens", str(max_new_tokens), "--page-size", str(page_size), "--json"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ck.path), str(ROOT)]))
    if share > 1 and "OMP_NUM_THREADS" not in env:  # share 个进程同时跑：平分 CPU 核
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // share))
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "trace.json"
        res = subprocess.run([sys.executable, "-m", "tools.trace.record", str(out), "--", *gen], cwd=ck.path, env=env,
                             capture_output=True, text=True)
        if out.exists():
            data = json.loads(out.read_text(encoding="utf-8"))
        else:  # 检查点连 import 都没过
            lines = (res.stderr or res.stdout).strip().splitlines()
            data = {"steps": [], "vocab": {}, "error": lines[-1] if lines else f"退出码 {res.returncode}"}
    if data["error"]:
        data["error"] = data["error"].removeprefix("错误：")
    return {"checkpoint": ck.path.name, "chapter": ck.chapter, "model": model.name, "page_size": page_size,
            "prompts": prompts, "max_new_tokens": max_new_tokens, **data}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # 一行中文，不打印用法和回溯
        message = message.replace("unrecognized arguments:", "不认识的参数：").replace("argument ", "")
        raise TraceError(message)


def _positive(name: str):
    def parse(s: str) -> int:
        if not s.isdigit() or int(s) < 1:
            raise argparse.ArgumentTypeError(f"要一个正整数，收到 {s!r}")
        return int(s)
    parse.__name__ = name
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python course.py trace", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", default="ch6", help="chN、检查点名字，或自己的目录（配合 --as）")
    ap.add_argument("--as", dest="as_chapter", help="自己的目录按哪一章跑（ch1…ch6）")
    ap.add_argument("--against", help="参考检查点：报出第一个不同的步和字段")
    ap.add_argument("--model", type=Path, help="默认和 python course.py demo 用同一个模型")
    ap.add_argument("--prompt", action="append", help="可以给多次；默认里程碑的 4 个提示词")
    ap.add_argument("--max-new-tokens", type=_positive("--max-new-tokens"), default=16)
    ap.add_argument("--page-size", type=_positive("--page-size"), action="append",
                    help="一页几个槽位；给几次就并排几份（默认 1）")
    ap.add_argument("-o", "--output", type=Path, default=Path("trace.html"), help="写到哪个 HTML 文件")
    return ap


def _checkpoint(spec: str, as_chapter: str | None) -> Checkpoint:
    try:
        return find_checkpoint(spec, as_chapter)
    except SystemExit as e:  # 清单给的说明本来就是一句中文
        raise TraceError(str(e).removeprefix("错误：")) from None


def trace(argv: list[str]) -> tuple[list[dict], dict | None, Path]:
    """解析参数、跑检查点（和参考），写 HTML。返回 (每份记录, 第一个不同, 写到的文件)。"""
    from tools.trace.diff import first_difference
    from tools.trace.html import render

    args = build_parser().parse_args(argv)
    ck = _checkpoint(args.checkpoint, args.as_chapter)
    ref = _checkpoint(args.against, None) if args.against else None
    page_sizes = args.page_size or [1]
    if ref is not None and len(page_sizes) > 1:
        raise TraceError("--against 只能配一个 --page-size")
    if args.output.is_dir() or not args.output.resolve().parent.is_dir():
        raise TraceError(f"-o {args.output}：要一个文件路径，它所在的目录必须已经存在")
    for c in [ck] + ([ref] if ref else []):
        check_chapter(c, page_sizes)
    model = args.model.resolve() if args.model else default_model()
    for c in [ck] + ([ref] if ref else []):
        if (why := unsupported(c, model)) and args.model:
            raise TraceError(f"--model {args.model}：{why}：换一个模型，例如 --model models/tiny/qwen3-tied")
        if why:  # 没指定模型：退回这一章跑得了的离线小模型
            from tools.models.make_tiny_models import make_all

            model = make_all(names=["qwen3-tied"])["qwen3-tied"]
            print(f"{why}：改用离线小模型 {model.relative_to(ROOT)}", file=sys.stderr)
    prompts = args.prompt or milestone_prompts()
    jobs = [(ck, ps) for ps in page_sizes] + ([(ref, page_sizes[0])] if ref else [])
    with ThreadPoolExecutor(len(jobs)) as pool:  # 几个进程同时跑，各用一份核
        traces = list(pool.map(lambda j: run_trace(j[0], model, prompts, args.max_new_tokens, j[1], len(jobs)), jobs))
    if not traces[0]["steps"] and traces[0]["error"] and ref is None:
        raise TraceError(f"{ck.path.name} 第 1 步之前就停了：{traces[0]['error']}")
    diff = first_difference(traces[0], traces[1]) if ref is not None else None
    args.output.write_text(render(traces, diff), encoding="utf-8")
    return traces, diff, args.output


def main(argv: list[str] | None = None) -> int:
    """打印顺序：有 --against 时先是第一个不同（或"没有不同"），然后是写到的文件。"""
    try:
        traces, diff, out = trace(sys.argv[1:] if argv is None else argv)
    except TraceError as e:
        print(f"错误：{e}", file=sys.stderr)
        return 2
    if len(traces) == 2 and diff is None and not traces[0]["error"]:
        print(f"和参考 {traces[1]['checkpoint']} 逐步逐字段相同（{len(traces[0]['steps'])} 步）")
    elif diff is not None:
        print(diff["message"])
    failed = [t for t in traces if t["error"]]
    for t in failed:
        print(f"错误：{t['checkpoint']} 在第 {len(t['steps'])} 步停下：{t['error']}", file=sys.stderr)
    t = traces[0]
    print(f"写好了 {out}：{t['checkpoint']}，模型 {t['model']}，{len(t['steps'])} 步；用浏览器打开，左右方向键换步")
    return 1 if diff is not None or failed else 0


if __name__ == "__main__":
    sys.exit(main())
