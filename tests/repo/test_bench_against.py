"""python -m tools.bench --against / --variants（tools/bench/against.py）：同一次运行里轮流量的 A/B。

不计时、不起 Engine：用假的几份结果核对表怎么写（每轮的数、同一轮的比值、中位数），--against 的参数怎么认，
以及附录引用的 docs/snippets/bench_against.md 和脚本现在写的一致、比值能用表里的数重新算出来。"""

from __future__ import annotations

import re
import statistics
import subprocess
from pathlib import Path

import pytest

from tools.bench import against
from tools.manifest import ROOT

from tests.repo.test_bench_snippet import tables


def fake(label: str, bs1: list[float], bs4: list[float]) -> against.Contender:
    c = against.Contender(label, ROOT)
    c.steps = {1: bs1, 4: bs4}
    c.plan, c.pages = f"{label} 的读法", "权重 1 / 1 MiB 在 2 MB 大页上"
    return c


def test_table_has_every_round_and_same_round_ratios_against_the_first():
    base = fake("本仓库", [0.1, 0.2, 0.1], [0.2, 0.2, 0.4])
    other = fake("别的", [0.11, 0.18, 0.1], [0.2, 0.3, 0.4])
    [rows] = tables(against.table([base, other], 3, 16))
    assert rows[1][0] == "本仓库" and rows[1][3:] == ["—"] * 4
    assert rows[2][1] == "110.0, 180.0, 100.0" and rows[2][2] == "200.0, 300.0, 400.0"
    assert rows[2][3] == "1.10, 0.90, 1.00" and rows[2][4] == "1.00, 1.50, 1.00"
    assert rows[2][5:] == ["1.00", "1.00"]  # 中位数：同一轮的比值的，不是各自最快的比


def test_against_takes_a_folder_or_a_commit_and_refuses_anything_else(tmp_path, monkeypatch):
    mine = tmp_path / "my_ch6"
    (mine / "minisgl").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert against.resolve("my_ch6", tmp_path).folder == mine.resolve()
    with pytest.raises(SystemExit) as e:
        against.resolve("no-such-rev-or-folder", tmp_path)
    assert str(e.value) == "错误：--against no-such-rev-or-folder：既不是有 minisgl/ 的文件夹，也不是这个仓库里的提交"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("不是 git 仓库（比如解压的源码包）：没有提交可取")
    (tmp_path / "rev").mkdir()
    got = against.resolve("HEAD", tmp_path / "rev")
    assert (got.folder / "minisgl" / "engine" / "engine.py").is_file() and got.label == "HEAD"


def test_the_snippet_is_what_against_writes_and_its_ratios_follow_from_its_times():
    path = against.SNIPPET
    assert path.is_file(), f"{path} 不存在：运行 {against.COMMAND} 生成它"
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"<!-- 由 tools/bench/against.py 生成，不要手改；重新生成：{against.COMMAND} -->")
    assert f"命令：`{against.COMMAND}`" in text
    assert re.search(r"机器：.+（.+；L3 .+），\d+ 核；torch \S+，\d+ 个线程", text), "写明在哪台机器上量的"
    [rows] = tables(text)
    fresh = tables(against.table([fake("a", [1.0], [1.0]), fake("b", [1.0], [1.0])], 1, 1))[0]
    assert rows[0] == fresh[0], "表头和脚本现在写的一样"
    base = [[float(x) for x in rows[1][i].split(", ")] for i in (1, 2)]
    for row in rows[2:]:
        for col, bs in ((1, 0), (2, 1)):
            ms = [float(x) for x in row[col].split(", ")]
            ratios = [a / b for a, b in zip(ms, base[bs])]
            shown = [float(x) for x in row[3 + bs].split(", ")]
            assert shown == pytest.approx(ratios, abs=0.006), row
            assert float(row[5 + bs]) == pytest.approx(statistics.median(shown), abs=0.006), row
    labels = [r[0] for r in rows[1:]]
    assert labels[0] == "本仓库（按实测选）" and any(lbl.startswith("本仓库，强制 ") for lbl in labels)
    assert all(f"- {lbl}：" in text for lbl in labels), "每一份都写了它选的读法和权重在哪种页上"


def test_a_forced_variant_with_the_same_table_is_named_as_the_a_a_row():
    base, same, other = (fake("本仓库", [0.1], [0.1]), fake("强制 tile", [0.1], [0.1]), fake("强制 row", [0.1], [0.1]))
    base.table, same.table, other.table = [0] * 8, [0] * 8, [1] * 4 + [0] * 4
    text = against.table([base, same, other], 1, 1)
    assert "强制 tile和本仓库是同一份代码、同一张表：这一行是 A/A" in text and "强制 row和" not in text


def test_the_appendix_includes_the_snippet():
    assert '--8<-- "docs/snippets/bench_against.md"' in (ROOT / "docs" / "appendix-cpu-matmul.md").read_text()
    assert Path(against.SNIPPET).parent == ROOT / "docs" / "snippets"
