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
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from tools.manifest import ROOT, find_checkpoint, given_test_patterns, load_manifest
from tools.suite.parts import Part, choose_jobs, load_record, save_record, threads_per_job
from tools.suite.procs import STOPPED, capped, run_part, stop, write_bytecode
from tools.suite.profile import save_last_run
from tools.suite.real import prepare_real, real_present, real_tier
from tools.workbench.course_record import write_check
from tools.workbench.task_table import progress_table

SITE_TEST = "tests/repo/test_site.py"
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
SKIP = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", re.M)  # pytest -rs 的一行：SKIPPED [个数] 文件:行: 理由
# 一个检查点分几份同时跑时各份的 nice：本章的任务 0（进度表先出来）；真权重一档是最长的一条链（几个大子进程、
# 再一次真模型生成），比给定代码、回归这些短测试先拿到 CPU，最后才不会只剩它独自跑、另一个核闲着
NICE = {"真权重一档": 5}
NICE_REST = 10
DETAILS_CAP = 20000  # 失败细节一共最多打印这么多字符：开头（最先失败的测试）加结尾（pytest 的简短汇总）


def build_parser() -> argparse.ArgumentParser:
    """命令行；tests/repo/test_docs.py 用它核对书里写的每条 run_tests.py 命令都真的能解析。"""
    ap = argparse.ArgumentParser(prog="python course.py check|test（即 python -m tools.run_tests）",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="只测这一个检查点（名字、chN 或目录）")
    ap.add_argument("--as", dest="as_chapter")
    ap.add_argument("--real", action="store_true", help="另跑真权重一档")
    ap.add_argument("--no-docs", action="store_true", help="不构建文档、不开浏览器")
    ap.add_argument("--real-if-present", action="store_true",
                    help="有真模型就跑真权重一档，没有就说跳过（course.py check 用）")
    ap.add_argument("--task", type=int, help="只跑这一章的任务 K（和 checkpoint 一起用）；真权重一档只在加了 --real "
                    "且任务 K 含它时跑")
    ap.add_argument("--own", action="store_true", help="只跑这一章自己的任务：不跑回归、真权重一档、给定代码的测试")
    ap.add_argument("--emulate-cuda", action="store_true",
                    help="第 5、6 章：整个测试进程看得见模拟的 CUDA（一台 GPU 机器上的整套测试会做什么）")
    ap.add_argument("-j", "--jobs", type=int, help="同时跑几份（默认按能用的核和空闲内存定，见 tools/suite/parts.py）")
    return ap


def main() -> int:
    args, extra = build_parser().parse_known_args()

    # 先写好小模型，免得几个 pytest 进程同时去写。在子进程里做：本进程不 import torch，它起的每一份记下的峰值内存才是
    # 那一份自己的（fork 出来的进程在 exec 之前顶着父进程的内存，os.wait4 的峰值会把它算进去）
    made = subprocess.run([sys.executable, "-m", "tools.models.make_tiny_models"], cwd=ROOT, capture_output=True,
                          text=True)
    if made.returncode != 0:
        print(f"错误：做不出离线小模型：{(made.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
        return 1
    pytest = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-p", "tests.harness.progress",
              "--tb=short", "-rs", *extra]
    env = write_bytecode(dict(os.environ))
    if args.emulate_cuda:  # tests/conftest.py 读它：整个进程看得见（模拟的）CUDA，见测试页"模拟的 CUDA"
        if not args.checkpoint or find_checkpoint(args.checkpoint, args.as_chapter).chapter < 5:
            print("错误：--emulate-cuda 只用于第 5、6 章（有注意力后端和 Engine 的检查点）：python course.py test ch6 "
                  "--emulate-cuda", flush=True)
            return 2
        env["MINISGL_EMULATE_CUDA"] = "1"
    if args.checkpoint:
        return _one_checkpoint(args, pytest, env)
    if args.real_if_present and not args.real:
        args.real = real_present()
    if args.real:  # 真模型也在子进程里做（理由同上）；做不出来时它说明，测试随后失败
        subprocess.run([sys.executable, "-c", "from tools.suite.real import prepare_real; prepare_real()"], cwd=ROOT)
        pytest.append("--real")
    record = load_record()
    # 长的先起（上次量到的 CPU 秒；没量过时仓库级最长，其次按清单倒序：第 6 章最长），最后不会只剩一份独自跑
    jobs = [("仓库级", pytest + ["--ignore", SITE_TEST], {})]
    jobs += [(c.name, pytest + ["--checkpoint", c.name], {}) for c in reversed(load_manifest())]
    if not args.no_docs:  # mkdocs build --strict，再在无头浏览器里打开（tests/repo/test_site.py）
        jobs.insert(2, ("文档", [sys.executable, "-m", "pytest", SITE_TEST, "-q", "-p", "no:cacheprovider", "-rs"], {}))
    jobs.sort(key=lambda job: -record.get(job[0], Part()).cpu_s)
    n_jobs, why = (args.jobs, f"同时跑 {args.jobs} 份（-j {args.jobs}）") if args.jobs else \
        choose_jobs([name for name, _, _ in jobs])
    env.setdefault("OMP_NUM_THREADS", str(threads_per_job(n_jobs)))
    print(f"{why}；每份 {env['OMP_NUM_THREADS']} 个线程", flush=True)
    # 最长的几份（仓库级、第 6 章，或者上次量到占全部 CPU 秒五分之一以上的）再用 pytest-xdist 分给 n_jobs 个进程；
    # --dist loadfile：同一个文件的测试在同一个进程里，文件里共用的 Engine、模块级的夹具只建一次
    total = sum(p.cpu_s for p in record.values())
    split = {"仓库级", load_manifest()[-1].name} | {n for n, p in record.items() if total and p.cpu_s >= total / 5}
    if n_jobs > 1:
        jobs = [(name, cmd + (["-n", str(n_jobs), "--dist", "loadfile"] if name in split else []), extra)
                for name, cmd, extra in jobs]
    tally: dict = {}
    results: dict[str, dict] = {}
    t0 = time.perf_counter()
    passed, failed, details = _run(jobs, env, n_jobs, lambda name, res: results.update({name: res}), tally=tally,
                                   record=True)
    wall = _wall(t0, jobs, n_jobs)
    save_last_run(wall[0], n_jobs, env["OMP_NUM_THREADS"], tally["parts"], results)  # 测试页的用量表读它
    return _finish(passed, failed, details, tally.get("skipped", 0), wall)


def _one_checkpoint(args, pytest: list[str], env: dict) -> int:
    """一个检查点分几个进程，同时起：本章的任务优先、它的进度表一出来就打印；给定代码自己的测试、前面各章的测试
    （回归）和真权重一档调低了优先级，用它空出来的 CPU；本章的任务没全过时真权重一档停下（_stop）。
    --own 只跑本章的任务；--task K 只跑本章任务 K（真权重一档
    只在 --real 且任务 K 含它时）。"""
    ck = find_checkpoint(args.checkpoint, args.as_chapter)
    book = next(c.name for c in load_manifest() if c.chapter == ck.chapter)
    what = f"按第 {ck.chapter} 章的要求" + ("" if ck.path.name == book else f"（书里这一章的参考是 {book}）")
    print(f"测 {ck.path.name}：{what}", flush=True)
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
    if real_tier(args, ck):
        prepare_real()
        jobs.append(("真权重一档", base + ["--real"], dict(sel, MINISGL_SELECT="real")))
    merged: dict = {}

    def collect(name, results):
        bad = not results or any(r["outcome"] in ("failed", "error") for r in results.values())
        if name == "本章的任务" and bad and not args.task:  # 本章的任务没全过：真模型上再跑一遍说不出新东西
            stop("真权重一档")
        merged.update(results)

    # 几份同时起，第一份（本章的任务）优先，其余的调低优先级：它们只用第一份空出来的 CPU，
    # 最后也不会剩一个进程独自跑、另一个核闲着。-j 1 时一份接一份
    n_jobs = len(jobs) if (args.jobs or choose_jobs([name for name, _, _ in jobs])[0]) > 1 else 1
    env.setdefault("OMP_NUM_THREADS", str(threads_per_job(n_jobs)))
    tally: dict = {}
    t0 = time.perf_counter()
    passed, failed, details = _run(jobs, env, n_jobs, collect, empty_ok=True, nice_rest=n_jobs > 1, tally=tally)
    # 表只打一次，在全部跑完之后：真权重一档的测试归在某个任务下，早打的表会和这张对不上
    table, _ = progress_table(merged, ck.chapter, only_task=args.task)
    only = f"，只跑任务 {args.task}" if args.task else "，只跑本章的任务" if args.own else ""
    ran = f"；跑了：{'、'.join(name for name, _, _ in jobs if name not in STOPPED)}" if len(jobs) > 1 else ""
    print(f"\n{ck.path.name}（按第 {ck.chapter} 章的任务{only}{ran}）：\n{table}\n", flush=True)
    learner = ck.path.resolve() not in {c.path.resolve() for c in load_manifest()}
    if learner:  # 读者的目录：记下来给 progress 看
        selection = f"task {args.task}" if args.task else "own" if args.own else "all"
        write_check(ck.path, ck.chapter, merged, selection)
    code = _finish(passed, failed, details, tally.get("skipped", 0), _wall(t0, jobs, n_jobs))
    if learner and code == 0:
        print(next_step(ck, whole), flush=True)
    return code


def next_step(ck, whole: bool) -> str:
    """读者的目录全过之后的下一条命令：--task / --own 之后是整章的 check；整章过了是下一章的 start，第 6 章是演示。"""
    from tools.workbench.course_start import shown

    where = shown(ck.path)
    if not whole:
        return f"下一步（整章，加上回归、给定代码的测试）：python course.py check {where} --as ch{ck.chapter}"
    if ck.chapter >= max(c.chapter for c in load_manifest()):
        return f"下一步：在你的引擎上跑阶段一的里程碑：python course.py demo {where}"
    return f"下一步：python course.py start ch{ck.chapter + 1} --from {where}"


def _wall(t0: float, jobs: list, n_jobs: int) -> tuple[float, bool]:
    """(整次的墙上时间, 是不是几份同时跑的)：同时跑时每一份的秒数互相重叠，加起来比墙上时间长。"""
    return time.perf_counter() - t0, n_jobs > 1 and len(jobs) > 1


def _run(jobs, env: dict, n_jobs: int, on_done=None, empty_ok: bool = False, nice_rest: bool = False,
         tally: dict | None = None, record: bool = False):
    """并行跑 jobs（第一份优先，nice_rest 时其余的调低优先级），哪一份先完成就先打印它的一行摘要；
    on_done(name, results) 在打印之后调用。tally 给了时把跳过的个数加进 tally["skipped"]（返回值仍是三项：
    tools/arch/ 也用它）。record 时把每份的峰值内存、CPU 秒记进 .cache/course/parts.json（下次定份数、排先后用）。"""
    passed = failed = 0
    details = []
    used: dict[str, Part] = {}
    with ThreadPoolExecutor(n_jobs) as pool:
        runs = [pool.submit(run_part, name, cmd, dict(env, **extra), NICE.get(name, NICE_REST) if nice_rest and i
                            else 0) for i, (name, cmd, extra) in enumerate(jobs)]
        for done in as_completed(runs):
            name, rc, out, secs, results, part = done.result()
            used[name] = part
            if name in STOPPED:
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
            skipped = f", {counts.get('skipped', 0)} skipped"  # 0 也写：全过和"全跳过了"一眼分得开
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
    if record:
        save_record({name: part for name, part in used.items() if name not in STOPPED})
    if tally is not None:
        tally["parts"] = used
    return passed, failed, details


def _finish(passed: int, failed: int, details: list, skipped: int = 0, wall: tuple[float, bool] | None = None) -> int:
    """最后一行是 pytest 式的计数（跳过的个数 0 也写）；wall 是 _wall 的结果：几份同时跑时说明各份的秒数有重叠。"""
    if wall is not None:
        overlap = "；上面几份同时跑，各自的秒数互相重叠，加起来比它长" if wall[1] else ""
        print(f"墙上时间 {wall[0]:.0f} s{overlap}")
    counts = f"{passed} passed, {failed} failed, {skipped} skipped"
    print(counts)
    for name, out in details:
        print(f"\n======== {name} 的失败细节 ========")
        print(capped(out, DETAILS_CAP // len(details)))
    if details:
        print(f"\n{counts}（摘要见上面）")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
