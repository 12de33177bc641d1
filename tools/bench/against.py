"""同一次运行里的 A/B：本仓库第 6 章的 Engine 和另一份 Engine 轮流量 decode 一步（bs=1、bs=4），每轮算一对之比。

    .venv/bin/python -m tools.bench --random-qwen3-0.6b --against d06c9e5   # 另一个提交（取它的第 6 章）
    .venv/bin/python -m tools.bench --against my_ch6                        # 自己写的第 6 章（start 的文件夹）
    .venv/bin/python -m tools.bench --random-qwen3-0.6b --variants          # 再加每种读法各强制一份

每份 Engine 在自己的子进程里（两份 minisgl 不能在一个进程里），编自己的核、用同样的线程数；主进程按轮次叫它们轮流跑，
一轮里的顺序正反交替，每一轮都换一批新起的子进程（权重落在哪块内存、拿没拿到大页，是进程起来时定的）。共用的机器上带宽会一阵快一阵慢，各自最快的一轮可能来自不同时段：只有同一轮里紧挨着量的比值才算数。
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tools.manifest import ROOT, find_checkpoint

SNIPPET = ROOT / "docs" / "snippets" / "bench_against.md"
COMMAND = ".venv/bin/python -m tools.bench --random-qwen3-0.6b --against d06c9e5 --variants --repeat 9"
BATCHES = (1, 4)


@dataclass
class Contender:
    label: str
    folder: Path  # 有 minisgl/ 和 generate.py 的第 6 章文件夹
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    plan: str = ""  # 它的核选的读法（worker 载入后报回来）
    pages: str = ""  # 它的权重有多少在 2 MB 大页上（内存碎时内核给 4 KB 页，decode 会慢一截）
    table: list[int] | None = None  # 它的核 1~8 行各用哪种读法（ext.get_plan()）；旧的核没有这张表
    steps: dict[int, list[float]] = field(default_factory=lambda: {bs: [] for bs in BATCHES})

    def start(self, model: str, steps: int) -> None:
        env = {**os.environ, **self.env, "PYTHONPATH": os.pathsep.join([str(self.folder), str(ROOT)])}
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.bench.against", str(self.folder), model, str(steps)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._answer()
        self.plan, self.pages, self.table = ready["plan"], ready["pages"], ready.get("table")

    def step(self, bs: int) -> float:
        self.proc.stdin.write(f"{bs}\n")
        self.proc.stdin.flush()
        seconds = self._answer()["step"]
        self.steps[bs].append(seconds)
        return seconds

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"错误：{self.label} 的子进程退出了（退出码 {self.proc.wait()}，原因见上面它打印的）")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)


def resolve(spec: str, scratch: Path) -> Contender:
    """--against 的参数：有 minisgl/ 的文件夹（自己写的 my_ch6），或本仓库的一个提交（取它的 ch6_engine_sampler）。"""
    for base in (Path.cwd(), ROOT):
        if (base / spec / "minisgl").is_dir():
            return Contender(spec, (base / spec).resolve())
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"],
                         capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"错误：--against {spec}：既不是有 minisgl/ 的文件夹，也不是这个仓库里的提交")
    name = find_checkpoint("ch6").path.name
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev.stdout.strip(), name], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"错误：提交 {spec} 里没有 {name}/（{archive.stderr.decode().strip()[:200]}）")
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
    return Contender(spec, scratch / name)


def run(model: str, against: str | None, variants: bool, rounds: int, steps: int) -> str:
    """起各份 Engine，轮流量 rounds 轮，返回 markdown。"""
    from minisgl import kernel  # 调用方已经 use_checkpoint 到第 6 章：本仓库这份的读法有哪几种

    ext = kernel.extension()
    names = list(ext.variants) if ext is not None and variants else []
    scratch = Path(tempfile.mkdtemp(prefix="minisgl-against-"))
    this = Contender("本仓库（按实测选）", find_checkpoint("ch6").path)
    field_ = [this] + [Contender(f"本仓库，强制 {v}", this.folder, {"MINISGL_KERNEL_VARIANT": v}) for v in names]
    if against:
        field_.append(resolve(against, scratch))
    # 每份的权重落在哪块物理内存，是进程起来时定的，之后每轮都一样；有的虚拟机上这一项能差出一两倍（宿主机的
    # 内存分在几个 NUMA 节点上时）。所以每一轮都起一批新的子进程（起的顺序也轮换），这种差别落在哪一份头上是随机的，
    # 取中位数时不会整场都偏向同一份
    try:
        for r in range(rounds):
            order = field_[r % len(field_):] + field_[:r % len(field_)]
            for c in order:
                print(f"第 {r + 1}/{rounds} 轮：载入 {c.label}（{c.folder}）…", flush=True)
                c.start(model, steps)
            for c in (order if r % 2 == 0 else order[::-1]):  # 一轮正、一轮反：谁先谁后不偏向一方
                for bs in BATCHES:
                    c.step(bs)
            for c in field_:
                c.stop()
            print(f"第 {r + 1}/{rounds} 轮：" + "；".join(
                f"{c.label} {c.steps[1][-1] * 1e3:.1f} / {c.steps[4][-1] * 1e3:.1f} ms" for c in field_), flush=True)
    finally:
        for c in field_:
            c.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return table(field_, rounds, steps)


def ratios(c: Contender, base: Contender, bs: int) -> list[float]:
    return [a / b for a, b in zip(c.steps[bs], base.steps[bs])]


def table(field_: list[Contender], rounds: int, steps: int) -> str:
    base = field_[0]
    head = ["", *(f"bs={bs} 各轮 (ms/步)" for bs in BATCHES), *(f"bs={bs} / 本仓库，同一轮" for bs in BATCHES),
            *(f"bs={bs} 比值的中位数" for bs in BATCHES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in field_:
        cells = [", ".join(f"{s * 1e3:.1f}" for s in c.steps[bs]) for bs in BATCHES]
        same = [ratios(c, base, bs) for bs in BATCHES]
        cells += ["—" if c is base else ", ".join(f"{x:.2f}" for x in rs) for rs in same]
        cells += ["—" if c is base else f"{statistics.median(rs):.2f}" for rs in same]
        lines.append(f"| {c.label} | " + " | ".join(cells) + " |")
    lines += ["", f"{rounds} 轮，每轮各份依次量 bs=1、bs=4（decode {steps} 步的平均），顺序一轮正一轮反；"
              "每轮都起一批新的子进程（权重落在哪块内存是进程起来时定的）。",
              "各份的核选的读法、权重在哪种页上（没在大页上的那份慢，不一定是代码的事）：", ""]
    lines += [f"- {c.label}：{c.plan}；{c.pages}" for c in field_]
    same = [c.label for c in field_[1:] if c.folder == base.folder and c.table is not None and c.table == base.table]
    if same:  # 同一份代码、同一张表：这一行是 A/A，它离 1 多远，就是这台机器上两个进程之间的差别有多大
        lines += ["", f"{'、'.join(same)}和{base.label}是同一份代码、同一张表：这一行是 A/A，"
                  "它的比值离 1 多远，就是这台机器上两个进程之间本来就有的差别，比它小的差别不算数。"]
    return "\n".join(lines) + "\n"


def worker(folder: str, model: str, steps: int) -> None:
    """子进程：载入 folder 的 Engine，报回它的读法；之后每读到一行 bs 就量一次，报回 decode 每步的秒数。"""
    import contextlib

    from tools.bench.memory import huge_page_line
    from tools.bench.timing import PROMPTS, load_engine, time_engine

    sys.path.insert(0, folder)
    from minisgl import kernel
    from transformers import AutoTokenizer

    with contextlib.redirect_stdout(sys.stderr):  # stdout 只留给一行一行的 JSON
        engine = load_engine(model)
        tok = AutoTokenizer.from_pretrained(model)
        plan = getattr(kernel, "chosen_plan", lambda: None)()
        time_engine(engine, tok, PROMPTS, 3)  # 预热
    pages = huge_page_line(list(engine.model.state_dict().values()))
    ext = kernel.extension() if plan else None
    print(json.dumps({"plan": plan.line() if plan else "（这份核不按实测选读法）", "pages": pages,
                      "table": ext.get_plan() if ext is not None else None}, ensure_ascii=False), flush=True)
    for line in sys.stdin:
        with contextlib.redirect_stdout(sys.stderr):
            _, step = time_engine(engine, tok, PROMPTS[:int(line)], steps + 1)
        print(json.dumps({"step": step}), flush=True)
    engine.shutdown()


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
