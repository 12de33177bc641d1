"""整套测试的用量表：每份的墙上秒、CPU 秒、峰值内存，和最慢的 20 个测试。测试页的"测试花在哪里"一节 include 它。

    python course.py test                        # 全量跑一次（它把这次的用量记进 .cache/course/last_run.json）
    .venv/bin/python -m tools.suite.profile      # 按上次全量的记录写 docs/snippets/suite_profile.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tools.manifest import ROOT

LAST_RUN = ROOT / ".cache" / "course" / "last_run.json"
SNIPPET = ROOT / "docs" / "snippets" / "suite_profile.md"
SLOWEST = 20
COMMAND = "python course.py test && .venv/bin/python -m tools.suite.profile"


def save_last_run(wall: float, jobs: int, threads: str, parts: dict, results: dict[str, dict]) -> None:
    """run_tests 全量跑完时调用：parts 是 {份: Part}，results 是 {份: {node id: 结果}}（带 seconds）。"""
    from tools.bench.machine import cpu_name
    from tools.suite.parts import usable_cores

    tests = {f"{part}\t{nodeid}": r.get("seconds", 0.0) for part, res in results.items() for nodeid, r in res.items()}
    run = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_name(), "cores": usable_cores(),
           "wall": round(wall, 1), "jobs": jobs, "threads": threads,
           "parts": {name: vars(p) for name, p in parts.items()},
           "slowest": dict(sorted(tests.items(), key=lambda kv: -kv[1])[:SLOWEST])}
    LAST_RUN.parent.mkdir(parents=True, exist_ok=True)
    LAST_RUN.write_text(json.dumps(run, ensure_ascii=False, indent=1), encoding="utf-8")


def render(run: dict) -> str:
    """上次全量的记录 -> markdown。CPU 秒是这一份的 pytest 和它等到了的子进程的 user + sys。"""
    parts = sorted(run["parts"].items(), key=lambda kv: -kv[1]["cpu_s"])
    total = sum(p["cpu_s"] for _, p in parts)
    lines = [f"<!-- 由 tools/suite/profile.py 生成，不要手改；重新生成：{COMMAND} -->", "",
             f"日期：{run['date']}；机器：{run['cpu']}，{run['cores']} 核<br>",
             f"墙上时间 {run['wall']:.0f} s；同时跑 {run['jobs']} 份，每份 {run['threads']} 个线程；"
             f"各份 CPU 秒合计 {total:.0f} s", "",
             "| 一份 | 墙上 s | CPU s | 峰值内存 MB |", "|---|---|---|---|"]
    lines += [f"| {name} | {p['wall_s']:.0f} | {p['cpu_s']:.0f} | {p['peak_mb']} |" for name, p in parts]
    lines += ["", f"最慢的 {len(run['slowest'])} 个测试（setup + call + teardown；同时跑时别的份也在抢 CPU）：", "",
              "| 一份 | 测试 | s |", "|---|---|---|"]
    for key, secs in run["slowest"].items():
        part, nodeid = key.split("\t", 1)
        lines.append(f"| {part} | `{nodeid}` | {secs:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not LAST_RUN.exists():
        print(f"错误：没有 {LAST_RUN.relative_to(ROOT)}：先全量跑一次 python course.py test", file=sys.stderr)
        return 1
    SNIPPET.write_text(render(json.loads(LAST_RUN.read_text(encoding="utf-8"))), encoding="utf-8")
    print(f"写好了 {SNIPPET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
