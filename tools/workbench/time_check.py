"""量 python course.py check 要等多久：每章一个整个的 check，以及每个 --task K。是基准，不是测试：只打印一张表。

    python -m tools.workbench.time_check                       # 全部六章
    python -m tools.workbench.time_check ch6 --tasks           # 只量第 6 章：整个 check 和每个 --task K
    python -m tools.workbench.time_check --repo /tmp/old ch3   # 量另一份仓库（比如改动之前的版本），同一台机器同一轮

每章先把参考检查点复制成一个读者目录（和 course.py start 之后写完了一样），在那里跑：读者的目录才会走 check 的
全部路径（记录结果、第 6 章的 C++ 核按目录编一次）。C++ 核先编好（不算进时间）：它每个目录只编一次。
墙钟时间受同一台机器上别的进程影响；子进程的 CPU 时间（用户 + 系统）不太受影响，一起列出来。
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.machine import cpu_name
from tools.manifest import ROOT, checkpoint_files, load_manifest, load_tasks


JOB = re.compile(r"^(?:通过|失败)\s+(.+?): .*（(\d+) s）$", re.M)


def timed(cmd: list[str], cwd: Path) -> tuple[float, float, int, str]:
    """(墙钟秒数, 子进程 CPU 秒数, 退出码, 各份进程各用了几秒)。"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    jobs = "、".join(f"{name} {secs}" for name, secs in JOB.findall(res.stdout))
    return wall, cpu, res.returncode, jobs


def warm_kernel(repo: Path, dest: Path) -> None:
    """第 6 章的 C++ 核按源文件的位置缓存：先在这个目录编好，量的是每次 check 都要花的时间。"""
    if (dest / "minisgl" / "kernel").is_dir():
        # 改动之前的仓库（--repo）里 extension 还在 kernel/cpu_linear.py
        code = ("import importlib; k = importlib.import_module('minisgl.kernel'); "
                "f = getattr(k, 'extension', None) or importlib.import_module('minisgl.kernel.cpu_linear').extension; "
                "assert f() is not None")
        subprocess.run([sys.executable, "-c", code], cwd=repo, env=dict(os.environ, PYTHONPATH=str(dest)),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def measure(repo: Path, tag: str, tasks: bool, work: Path) -> list[tuple]:
    ck = next(c for c in load_manifest() if c.name.split("_")[0] == tag)
    dest = work / f"my_{tag}"
    for rel, data in checkpoint_files(repo / ck.name).items():  # 只有普通文件：不读设备、不跟着链接出去
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    warm_kernel(repo, dest)
    check = [sys.executable, "course.py", "check", str(dest), "--as", tag]
    rows = [("整个 check", *timed(check, repo))]
    if tasks:
        for t in load_tasks().get(ck.chapter, []):
            rows.append((f"--task {t.number}", *timed(check + ["--task", str(t.number)], repo)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="ch1 … ch6；默认全部")
    ap.add_argument("--repo", type=Path, default=ROOT, help="量哪一份仓库（默认这一份）")
    ap.add_argument("--tasks", action="store_true", help="也量每个 --task K")
    args = ap.parse_args(argv)
    tags = args.chapters or [c.name.split("_")[0] for c in load_manifest() if c.chapter >= 1]
    load = os.getloadavg()
    print(f"{cpu_name()}，{os.cpu_count()} 核；"
          f"开始时的负载 {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}；仓库 {args.repo}\n")
    print("| 章 | 跑了什么 | 墙钟 s | 子进程 CPU s | 退出码 | 各份进程（s） |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="time_check_") as d:
        for tag in tags:
            for what, wall, cpu, rc, jobs in measure(args.repo.resolve(), tag, args.tasks, Path(d)):
                print(f"| {tag} | {what} | {wall:.0f} | {cpu:.0f} | {rc} | {jobs} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
