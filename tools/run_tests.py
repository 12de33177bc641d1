"""一次跑完全部测试：仓库级测试 + 每个检查点各一个 pytest 进程（它们都有一个叫 minisgl 的包）+ 文档构建。

    python -m tools.run_tests                  # 全部
    python -m tools.run_tests ch3              # 只测一个检查点（含第 1~3 章的累积测试）
    python -m tools.run_tests my_ch3 --as ch3  # 读者自己的目录
    python -m tools.run_tests my_ch3 --as ch3 --task 2   # 只跑第 3 章的任务 2
    python -m tools.run_tests my_ch3 --as ch3 --own      # 只跑第 3 章自己的任务（不跑回归、真权重、给定代码的测试）
    python -m tools.run_tests --real           # 另加真权重一档（没有真模型时先做 models/SmolLM2-135M）

先打印摘要（每个检查点一行），再打印失败的细节（--tb=short，有上限），所以摘要永远不会被长长的张量打印挤掉。
只测一个检查点时分几个进程同时跑：本章的任务、给定代码自己的测试和前面各章的测试（回归）、
真权重一档；每一份跑完打一行摘要，全部跑完打一张按任务的表（只打一次）和总的墙上时间。
测的是读者的目录（不是书里的检查点）时，结果记进 .cache/course/（workbench/course_record.py），
python course.py progress 读它。
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.workbench.course_record import write_check
from tools.manifest import ROOT, find_checkpoint, given_test_patterns, load_manifest, load_tasks
from tools.models.find import find_model, unsupported_reason
from tools.workbench.task_table import progress_table

SITE_TEST = "tests/repo/test_site.py"
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
SKIP = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", re.M)  # pytest -rs 的一行：SKIPPED [个数] 文件:行: 理由
# 一个检查点分几份同时跑时各份的 nice：本章的任务 0（进度表先出来）；真权重一档是最长的一条链（几个大子进程、
# 再一次真模型生成），比给定代码、回归这些短测试先拿到 CPU，最后才不会只剩它独自跑、另一个核闲着
NICE = {"真权重一档": 5}
NICE_REST = 10
_STARTED: dict[str, subprocess.Popen] = {}  # 名字 -> 这一份的 pytest 进程（停掉真权重一档时用）
_STOPPED: set[str] = set()
DETAILS_CAP = 20000  # 失败细节一共最多打印这么多字符：开头（最先失败的测试）加结尾（pytest 的简短汇总）


def _job(name: str, cmd: list[str], env: dict, nice: int = 0) -> tuple[str, int, str, float, dict]:
    """跑一份 pytest；nice > 0 时调低它（和它起的子进程）的优先级：只在有空闲的核时才轮到它。"""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        progress = Path(d) / "progress.json"
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(env, MINISGL_PROGRESS=str(progress)))
        _STARTED[name] = proc
        if nice and hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
        out, err = proc.communicate()
        results = json.loads(progress.read_text(encoding="utf-8")) if progress.exists() else {}
    return name, proc.returncode, out + err, time.perf_counter() - t0, results


def _stop(name: str) -> None:
    """停掉还在跑的一份：它的 pytest 进程和它起的全部子孙进程（Linux 上读 /proc 找），不留进程。"""
    proc = _STARTED.get(name)
    if proc is None or proc.poll() is not None:
        return
    _STOPPED.add(name)
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    todo, tree = [proc.pid], []
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for pid in tree:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def capped(out: str, cap: int) -> str:
    """保留开头（最先失败的测试）和结尾（short test summary），中间省略。"""
    if len(out) <= cap:
        return out
    tail = min(3000, cap // 4)
    return f"{out[:cap - tail]}\n\n…… 省略 {len(out) - cap} 个字符 ……\n\n{out[-tail:]}"


def build_parser() -> argparse.ArgumentParser:
    """命令行；tests/repo/test_docs.py 用它核对书里写的每条 run_tests.py 命令都真的能解析。"""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="只测这一个检查点（名字、chN 或目录）")
    ap.add_argument("--as", dest="as_chapter")
    ap.add_argument("--real", action="store_true", help="另跑真权重一档")
    ap.add_argument("--no-docs", action="store_true", help="不构建文档、不开浏览器")
    ap.add_argument("--real-if-present", action="store_true",
                    help="有真模型就跑真权重一档，没有就说跳过（course.py check 用）")
    ap.add_argument("--task", type=int, help="只跑这一章的任务 K（和 checkpoint 一起用）；真权重一档只在加了 --real "
                    "且任务 K 含它时跑")
    ap.add_argument("--own", action="store_true", help="只跑这一章自己的任务：不跑回归、真权重一档、给定代码的测试")
    ap.add_argument("-j", "--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    return ap


def main() -> int:
    args, extra = build_parser().parse_known_args()

    from tools.models.make_tiny_models import make_all

    make_all()  # 先写好小模型，免得几个 pytest 进程同时去写
    pytest = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-p", "tests.harness.progress",
              "--tb=short", "-rs", *extra]
    env = dict(os.environ)
    if args.jobs > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # 几个进程并行时各用一个线程，别互相抢核
    if args.checkpoint:
        return _one_checkpoint(args, pytest, env)
    if args.real_if_present and not args.real:
        args.real = _real_present()
    if args.real:
        _prepare_real()
        pytest.append("--real")
    jobs = [("仓库级", pytest + ["--ignore", SITE_TEST], {})]
    jobs += [(c.name, pytest + ["--checkpoint", c.name], {}) for c in load_manifest()]
    if not args.no_docs:  # mkdocs build --strict，再在无头浏览器里打开（tests/repo/test_site.py）
        jobs.append(("文档", [sys.executable, "-m", "pytest", SITE_TEST, "-q", "-p", "no:cacheprovider", "-rs"], {}))
    tally: dict = {}
    t0 = time.perf_counter()
    passed, failed, details = _run(jobs, env, args.jobs, tally=tally)
    return _finish(passed, failed, details, tally.get("skipped", 0), _wall(t0, jobs, args.jobs))


def _real_present() -> bool:
    """course.py check（--real-if-present）：有真模型就带上真权重一档，没有就说一声。"""
    real = find_model()
    if real is None:
        print("真权重一档：跳过（models/ 下没有真模型；python -m tools.models.make_smollm2 做一个）", flush=True)
    return real is not None


def _prepare_real() -> None:
    """还没有真模型就先做 SmolLM2（只做一次，免得几个进程同时做）；做不出来时测试随后失败并说明。"""
    from tools.models.make_smollm2 import ModelUnavailable

    try:
        find_model(make=True)
    except ModelUnavailable as e:
        print(f"真权重一档没有模型：\n{e}", flush=True)


def _one_checkpoint(args, pytest: list[str], env: dict) -> int:
    """一个检查点分几个进程，同时起：本章的任务优先、它的进度表一出来就打印；给定代码自己的测试、前面各章的测试
    （回归）和真权重一档调低了优先级，用它空出来的 CPU；本章的任务没全过时真权重一档停下（_stop）。
    --own 只跑本章的任务；--task K 只跑本章任务 K（真权重一档
    只在 --real 且任务 K 含它时）。"""
    ck = find_checkpoint(args.checkpoint, args.as_chapter)
    base = pytest + ["--checkpoint", args.checkpoint] + (["--as", args.as_chapter] if args.as_chapter else [])
    sel = dict(MINISGL_CHAPTER=str(ck.chapter), **({"MINISGL_TASK": str(args.task)} if args.task else {}))
    jobs = [("本章的任务", base, dict(sel, MINISGL_SELECT="own"))]
    whole = not args.task and not args.own
    # 给定代码的测试和回归放进同一个进程：都是短测试，少起一个 pytest 就少一遍 import torch 和收集（约 6 CPU 秒）
    rest = {"given": "给定代码的测试", "regress": "前面各章（回归）"}
    if not (whole and given_test_patterns(ck.chapter)):
        rest.pop("given")
    if not (whole and ck.chapter >= 2):
        rest.pop("regress")
    if rest:
        jobs.append(("和".join(rest.values()), base, dict(sel, MINISGL_SELECT=",".join(rest))))
    if _real_tier(args, ck):
        _prepare_real()
        jobs.append(("真权重一档", base + ["--real"], dict(sel, MINISGL_SELECT="real")))
    merged: dict = {}

    def collect(name, results):
        bad = not results or any(r["outcome"] in ("failed", "error") for r in results.values())
        if name == "本章的任务" and bad and not args.task:  # 本章的任务没全过：真模型上再跑一遍说不出新东西
            _stop("真权重一档")
        merged.update(results)

    # 几份同时起，第一份（本章的任务）优先，其余的调低优先级：它们只用第一份空出来的 CPU，
    # 最后也不会剩一个进程独自跑、另一个核闲着。-j 1 时一份接一份
    n_jobs = len(jobs) if args.jobs > 1 else 1
    tally: dict = {}
    t0 = time.perf_counter()
    passed, failed, details = _run(jobs, env, n_jobs, collect, empty_ok=True, nice_rest=args.jobs > 1, tally=tally)
    # 表只打一次，在全部跑完之后：真权重一档的测试归在某个任务下，早打的表会和这张对不上
    table, _ = progress_table(merged, ck.chapter, only_task=args.task)
    only = f"，只跑任务 {args.task}" if args.task else "，只跑本章的任务" if args.own else ""
    ran = f"；跑了：{'、'.join(name for name, _, _ in jobs if name not in _STOPPED)}" if len(jobs) > 1 else ""
    print(f"\n{ck.path.name}（按第 {ck.chapter} 章的任务{only}{ran}）：\n{table}\n", flush=True)
    if ck.path.resolve() not in {c.path.resolve() for c in load_manifest()}:  # 读者的目录：记下来给 progress 看
        selection = f"task {args.task}" if args.task else "own" if args.own else "all"
        write_check(ck.path, ck.chapter, merged, selection)
    return _finish(passed, failed, details, tally.get("skipped", 0), _wall(t0, jobs, n_jobs))


def _wall(t0: float, jobs: list, n_jobs: int) -> tuple[float, bool]:
    """(整次的墙上时间, 是不是几份同时跑的)：同时跑时每一份的秒数互相重叠，加起来比墙上时间长。"""
    return time.perf_counter() - t0, n_jobs > 1 and len(jobs) > 1


def _real_tier(args, ck) -> bool:
    """这次跑不跑真权重一档，并说出为什么不跑（不起一个只为跳过的进程）。--own 不跑；--task K 只在明说了
    --real、而且任务 K 含它（tests/tasks.toml）时跑：--task 是要快的反馈。"""
    if not (args.real or args.real_if_present):
        return False
    if args.own:
        print("真权重一档：--own 只跑本章的任务，没有跑", flush=True)
        return False
    if args.task:
        task = next((t for t in load_tasks().get(ck.chapter, []) if t.number == args.task), None)
        if task is None or not any(p.startswith("tests/real/") for p in task.tests):
            print(f"真权重一档：任务 {args.task} 不含它（tests/tasks.toml），没有跑", flush=True)
            return False
        if not args.real:
            print(f"真权重一档：任务 {args.task} 含它，--task 只要快的反馈，这次没跑（加 --real 才跑）", flush=True)
            return False
    elif not args.real and not _real_present():
        return False
    real = find_model()
    why = unsupported_reason(ck, real.path) if real is not None else None
    if why:
        print(f"真权重一档：这一章不跑（说明，不是问题）。真模型 {why}。这一章和 HF 逐 token 对齐的检查用离线小模型，"
              "真模型上的检查从支持它的那一章起由 check 带上", flush=True)
        return False
    if real is not None:
        why = "" if args.real else "（check 有真模型就带上这一档；只要快的反馈用 --task K 或 --own）"
        print(f"真权重一档：用 {real.path}{why}", flush=True)
    return True


def _run(jobs, env: dict, n_jobs: int, on_done=None, empty_ok: bool = False, nice_rest: bool = False,
         tally: dict | None = None):
    """并行跑 jobs，按提交的顺序每完成一个打印一行摘要；on_done(name, results) 在打印之后调用。
    tally 给了时把跳过的个数加进 tally["skipped"]（返回值仍是三项：tools/arch/ 也用它）。"""
    passed = failed = 0
    details = []
    with ThreadPoolExecutor(n_jobs) as pool:
        runs = pool.map(lambda i: _job(jobs[i][0], jobs[i][1], dict(env, **jobs[i][2]),
                                       NICE.get(jobs[i][0], NICE_REST) if nice_rest and i else 0), range(len(jobs)))
        for name, rc, out, secs, results in runs:
            if name in _STOPPED:
                print(f"停下  {name}：本章的任务还没全过，先不跑它（全过了再 check，它才跑完）", flush=True)
                continue
            last = out.strip().splitlines()[-1] if out.strip() else ""
            counts = {k.rstrip("s"): int(n) for n, k in COUNT.findall(last)}
            p, f = counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0)
            if rc == 5 and empty_ok:  # 这一份挑完没有测试（比如 --task 选的任务没有真权重的测试）
                rc = 0
            if rc != 0 and f == 0:
                f = 1  # 收集错误、退出码 5（没有测试）等也算失败
            passed, failed = passed + p, failed + f
            if tally is not None:
                tally["skipped"] = tally.get("skipped", 0) + counts.get("skipped", 0)
            skipped = f", {counts['skipped']} skipped" if counts.get("skipped") else ""
            verdict = "通过" if f == 0 else "失败"
            print(f"{verdict}  {name}: {p} passed, {f} failed{skipped}（{secs:.0f} s）", flush=True)
            if counts.get("skipped"):  # 比如没装 chromium、第 0~2 步不支持 Llama：把理由告诉读者
                reasons: dict[str, int] = {}  # 同一个理由只说一次，带上它跳过了几个
                for n, why in SKIP.findall(out):
                    reasons[why] = reasons.get(why, 0) + int(n)
                print("\n".join(f"      跳过 {n} 个：{why}" for why, n in reasons.items()), flush=True)
            if rc != 0:
                details.append((name, out))
            if on_done:
                on_done(name, results)
    return passed, failed, details


def _finish(passed: int, failed: int, details: list, skipped: int = 0, wall: tuple[float, bool] | None = None) -> int:
    """最后一行是 pytest 式的计数（有跳过的才写 skipped）；wall 是 _wall 的结果：几份同时跑时说明各份的秒数有重叠。"""
    if wall is not None:
        overlap = "；上面几份同时跑，各自的秒数互相重叠，加起来比它长" if wall[1] else ""
        print(f"墙上时间 {wall[0]:.0f} s{overlap}")
    counts = f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
    print(counts)
    for name, out in details:
        print(f"\n======== {name} 的失败细节 ========")
        print(capped(out, DETAILS_CAP // len(details)))
    if details:
        print(f"\n{counts}（摘要见上面）")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
