"""minisgl.kernel.plan：1~8 行的矩阵乘在本机量出来用哪种读法。

- 挑法（choose）：给定的耗时表 → 确定的选择；差不到 TIE 的算打平，取 variants 里靠前的；
- 缓存（plan.json）：同一台机器、同样线程数、同一份库直接读，不再量；别的 CPU、线程数、库的那份不用、说一行；
  坏了的重新量、不出 traceback；
- MINISGL_KERNEL_VARIANT 强制一种读法（不量）；名字不对说一行可选的；
- C++ 的表：set_plan 只收每个行数管得了的读法，错了说一行；载入后的表就是 chosen_plan() 说的那张。
每种读法的数值在 test_kernel.py::test_kernel_matches_float64 里逐个核对。只核对选择的逻辑，从不断言哪种更快。
缓存那几项用一个假的扩展、换掉 plan.measure（真量要 120 MB 权重），这就是它们动的接缝。"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture
def plan():
    from minisgl.kernel import plan

    return plan


def test_choose_takes_the_smallest_median(plan):
    got = plan.choose({1: {"tile": 5.0, "row": 6.0}, 2: {"tile": 6.0, "row": 5.0}}, ["tile", "row"])
    assert got == {1: ("tile", "row", pytest.approx(0.2)), 2: ("row", "tile", pytest.approx(0.2))}


def test_choose_breaks_ties_by_order_whatever_the_dict_order(plan):
    """差不到 TIE（1%）算打平：取 order 里靠前的，和字典里谁先谁后无关。"""
    near = 1 + plan.TIE / 2
    for times in ({"tile": 1.0 * near, "row": 1.0}, {"row": 1.0, "tile": 1.0 * near}):
        assert plan.choose({3: times}, ["tile", "row"])[3][0] == "tile"
        assert plan.choose({3: times}, ["row", "tile"])[3][0] == "row"
    far = 1 + plan.TIE * 2
    assert plan.choose({3: {"tile": far, "row": 1.0}}, ["tile", "row"])[3][0] == "row"


def test_choose_skips_rows_with_one_candidate(plan):
    assert plan.choose({5: {"tile": 1.0}}, ["tile", "row"]) == {}


class FakeExt(SimpleNamespace):
    """只有 plan 用到的那几样：读法的名字、各管几行、线程数、库的名字和位置、C++ 的表。"""

    def __init__(self, tmp_path, threads=2, name="minisgl_kernel_abc"):
        super().__init__(variants=["tile", "row"], variant_rows=[8, 4], max_rows=8, table=None)
        self.__name__, self.__file__, self._threads = name, str(tmp_path / f"{name}.so"), threads

    def num_threads(self):
        return self._threads

    def set_plan(self, table):
        self.table = list(table)


MEDIANS = {1: {"tile": 2.0, "row": 1.0}, 2: {"tile": 1.0, "row": 2.0}, 3: {"tile": 1.0, "row": 3.0},
           4: {"tile": 1.0, "row": 1.5}}


@pytest.fixture
def measured(plan, monkeypatch):
    """换掉真量（plan.measure）和机器的负载（plan.machine_load、plan.cores：2 核、空闲），记下量了几次。"""
    calls = []
    monkeypatch.setattr(plan, "measure", lambda ext, rounds=plan.ROUNDS: calls.append(ext) or MEDIANS)
    monkeypatch.setattr(plan, "machine_load", lambda: 0.5)
    monkeypatch.setattr(plan, "cores", lambda: 2)
    monkeypatch.delenv(plan.VARIANT_ENV, raising=False)
    return calls


def _install(plan, ext):
    said = []
    got = plan.install(ext, said.append)
    return got, said


def test_first_load_measures_writes_the_cache_and_sets_the_table(plan, measured, tmp_path):
    ext = FakeExt(tmp_path)
    got, said = _install(plan, ext)
    assert len(measured) == 1 and got.how == "实测"
    assert got.table == {1: "row", **{n: "tile" for n in range(2, 9)}}
    assert ext.table == [1, 0, 0, 0, 0, 0, 0, 0]
    assert said == [got.line()] and "1 行 row（比 tile 快 100%）" in said[0] and "5~8 行 tile" in said[0]
    entry = json.loads((tmp_path / "plan.json").read_text())["entries"][0]
    assert entry["threads"] == 2 and entry["source"] == "minisgl_kernel_abc" and entry["table"]["1"] == "row"
    again, said = _install(plan, FakeExt(tmp_path))  # 第二次：读缓存，不量、不说
    assert len(measured) == 1 and again.how == "缓存" and again.table == got.table and said == []


@pytest.mark.parametrize("field,value", [("cpu", "另一台 CPU"), ("flags", "0000000000"),
                                         ("source", "minisgl_kernel_old")])
def test_an_entry_from_another_cpu_or_library_is_ignored_in_one_line(plan, measured, tmp_path, field, value):
    _install(plan, FakeExt(tmp_path))
    path = tmp_path / "plan.json"
    data = json.loads(path.read_text())
    data["entries"][0][field] = value
    data["entries"][0]["table"]["1"] = "tile"
    path.write_text(json.dumps(data))
    got, said = _install(plan, FakeExt(tmp_path))
    assert len(measured) == 2 and got.table[1] == "row"
    assert len(said) == 2 and f"（{field} 不同）" in said[0] and "重新量" in said[0]
    assert json.loads(path.read_text())["entries"][0][field] != value  # 换成这台机器的


def test_another_thread_count_is_measured_apart_and_both_are_kept(plan, measured, tmp_path):
    _install(plan, FakeExt(tmp_path, threads=4))
    got, said = _install(plan, FakeExt(tmp_path, threads=2))
    assert len(measured) == 2 and got.threads == 2
    assert said[0] == "plan.json 里只有 4 个线程的，这次 2 个线程：重新量"
    threads = sorted(e["threads"] for e in json.loads((tmp_path / "plan.json").read_text())["entries"])
    assert threads == [2, 4]
    _install(plan, FakeExt(tmp_path, threads=4))
    assert len(measured) == 2  # 4 个线程的那份还在


@pytest.mark.parametrize("text", ["{不是 JSON", '{"entries": 3}', "[]", '{"entries": [{"threads": 2, "table": 5}]}'])
def test_a_corrupt_cache_is_rebuilt_without_a_traceback(plan, measured, tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text(text)
    got, said = _install(plan, FakeExt(tmp_path))
    assert len(measured) == 1 and got.how == "实测" and len(said) == 2
    assert "重新量" in said[0] and "Traceback" not in said[0]
    assert json.loads(path.read_text())["entries"][0]["table"]["1"] == "row"


def test_the_environment_variable_forces_a_variant_without_measuring(plan, measured, tmp_path, monkeypatch):
    ext = FakeExt(tmp_path)
    monkeypatch.setenv(plan.VARIANT_ENV, "row")
    got, said = _install(plan, ext)
    assert measured == [] and said == [] and not (tmp_path / "plan.json").exists()
    assert ext.table == [1, 1, 1, 1, 0, 0, 0, 0]  # row 只管 1~4 行，别的是第一种
    assert got.line().endswith("：1~4 行 row、5~8 行 tile")
    monkeypatch.setenv(plan.VARIANT_ENV, "fast")  # 名字打错：说一行，照常按实测选，不抛 traceback
    got, said = _install(plan, ext)
    assert len(measured) == 1 and got.how == "实测" and ext.table == [1, 0, 0, 0, 0, 0, 0, 0]
    assert said[0] == f"{plan.VARIANT_ENV}=fast：没有这种读法，可选 tile、row；不用它，按实测选"


def test_a_table_measured_on_a_busy_machine_says_so_and_is_measured_again_once_quiet(plan, measured, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setattr(plan, "machine_load", lambda: 5.0)
    got, said = _install(plan, FakeExt(tmp_path))
    assert "量的时候机器正忙（1 分钟平均负载 5.0，2 核）" in said[0] and got.busy() in got.short()
    again, said = _install(plan, FakeExt(tmp_path))  # 还忙：用缓存里那份，不再量
    assert len(measured) == 1 and again.how == "缓存" and again.busy() and said == []
    monkeypatch.setattr(plan, "machine_load", lambda: 0.3)
    quiet, said = _install(plan, FakeExt(tmp_path))
    assert len(measured) == 2 and quiet.how == "实测" and not quiet.busy()
    assert said[0] == "plan.json 里那份是机器正忙的时候量的（1 分钟平均负载 5.0），现在闲下来了：重新量"
    monkeypatch.setattr(plan, "machine_load", lambda: 5.0)
    assert _install(plan, FakeExt(tmp_path))[0].how == "缓存" and len(measured) == 2  # 闲时量的那份一直用


def test_short_line_counts_ties_apart_from_leads(plan):
    table = {n: "tile" for n in range(1, 9)}
    lead = plan.Plan(table, {1: ("row", 0.19), 2: ("row", 0.04), 3: ("row", -0.003), 4: ("row", 0.001)}, "缓存")
    assert lead.short() == ("small_linear 的读法（本机实测过）：1~8 行 tile，领先次快的 4%~19%，"
                            "2 个行数和次快的打平（差不到 1%，取靠前的）")
    even = plan.Plan(table, {n: ("row", -0.004) for n in range(1, 5)}, "缓存")
    assert even.short() == "small_linear 的读法（本机实测过）：1~8 行 tile，4 个行数和次快的打平（差不到 1%，取靠前的）"


# ---------------------------------------------------------------- 真的扩展


def _ext_or_skip():
    from minisgl import kernel

    if (ext := kernel.extension()) is None:
        pytest.skip("C++ 核用不了（没有编译器，或被 probe 拒绝；test_kernel.py 核对这件事本身）")
    return ext


def test_the_loaded_table_is_the_one_chosen_plan_reports():
    from minisgl import kernel

    ext = _ext_or_skip()
    chosen = kernel.chosen_plan()
    assert ext.get_plan() == [list(ext.variants).index(chosen.table[n]) for n in range(1, ext.max_rows + 1)]
    assert chosen.line().startswith("small_linear 的读法（")


def test_set_plan_and_small_linear_refuse_a_variant_that_does_not_take_the_rows():
    ext = _ext_or_skip()
    before = ext.get_plan()
    row = list(ext.variants).index("row")
    lim = ext.variant_rows[row]
    cases = [(lambda: ext.set_plan([0] * 7), "set_plan: need one variant for each of 1..8 rows, got 7"),
             (lambda: ext.set_plan([0] * lim + [row] * (8 - lim)),
              f"set_plan: variant {row} does not take {lim + 1} rows"),
             (lambda: ext.set_plan([5] * 8), "set_plan: variant 5 does not take 1 rows"),
             (lambda: ext.small_linear(torch.randn(lim + 1, 8), torch.randn(3, 8), None, row),
              f"small_linear: variant {row} does not take {lim + 1} rows")]
    for call, want in cases:
        with pytest.raises(RuntimeError) as e:
            call()
        assert str(e.value).splitlines()[0] == want
    assert ext.get_plan() == before  # 错的表一行都不写


def test_measure_times_every_variant_for_rows_that_have_a_choice(plan):
    """第一次载入常在 Engine 建模型时：torch.device("meta") 和别的默认 dtype 之下也量的是 CPU 上的 fp32。"""
    ext = _ext_or_skip()
    before = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.device("meta"):
            got = plan.measure(ext, rounds=1)
    finally:
        torch.set_default_dtype(before)
    limits = dict(zip(ext.variants, ext.variant_rows))
    want = {n: sorted(v for v, lim in limits.items() if n <= lim) for n in range(1, ext.max_rows + 1)}
    assert {n: sorted(t) for n, t in got.items()} == {n: v for n, v in want.items() if len(v) > 1}
    assert all(s > 0 for t in got.values() for s in t.values())
