"""docs/snippets/bench_*.md 是 python -m tools.bench（和 tools.bench.kernels）的一次运行结果，书里直接引用：
核对它们没被手改坏、和脚本现在写的一致。

不计时、不重跑基准：只解析表格，用表里的时间重新算比值和 tokens/s，看和写着的是否对得上。
"""

import re

import pytest

from tools.bench import report as bench
from tools.bench.timing import Timing

SNIPPET = bench.SNIPPET


def tables(text: str) -> list[list[list[str]]]:
    """片段里的每张表：若干行单元格，第一行是表头（跳过分隔行）。"""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|(---\|)+", line):
                current.append([c.strip() for c in line.strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found


def parse(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """-> (时间表, 比值表)。后面还有第三张：两个下限的表（floors）。"""
    found = tables(text)
    assert len(found) == 3, f"应该正好三张表（时间、比值、两个下限），找到 {len(found)} 张"
    return found[0], found[1]


def floors(text: str) -> list[list[str]]:
    return tables(text)[2]


def fake_timing() -> Timing:
    """假结果：decode 有两个下限的表要的 bs=1~4，prefill 有 bs=1、4。"""
    return Timing({1: 0.1, 2: 0.15, 3: 0.18, 4: 0.2}, {1: 0.3, 4: 0.4})


def fake_meta() -> dict[str, str]:
    """report.render 要的抬头字段，全填 "x"（只核对表的形状时用）。"""
    return {k: "x" for k in ("command", "date", "machine", "transformers", "model", "kernels", "profile",
                             "weights_mib", "bandwidth", "steps", "repeat", "peak_rss", "weights_kv", "rss_over")}


def num(cell: str) -> float | None:
    return None if cell in ("—", "") else float(cell)


@pytest.fixture(scope="module", params=sorted(bench.SNIPPETS), ids=lambda p: p.name)
def snippet(request) -> tuple[str, str]:
    """-> (文件内容, 生成它的命令)。每个模型一份：Qwen3-0.6B 形状和 SmolLM2-135M。"""
    path, command = request.param, bench.SNIPPETS[request.param]
    assert path.is_file(), f"{path} 不存在：运行 {command} 生成它"
    return path.read_text(encoding="utf-8"), command


@pytest.fixture(scope="module")
def text(snippet) -> str:
    return snippet[0]


def test_header_names_command_date_machine_and_versions(snippet):
    text, command = snippet
    assert re.search(rf"命令：`{re.escape(command)}( --llama-bench PATH)?`", text), "抬头要写出生成它的命令"
    assert re.search(r"日期：\d{4}-\d\d-\d\d \d\d:\d\d UTC", text)
    assert re.search(r"机器：.+（.+；L3 .+），\d+ 核；torch \d+\.\d+\S*，\d+ 个线程", text), "CPU 型号、指令集、线程数"
    assert "一次运行" in text and "内存读带宽" in text and "线性层的核" in text
    assert re.search(r"一步 decode（bs=1，torch.profiler）：\d+ 个 ATen 算子.*矩阵乘占 \d+%", text), "decode 的去向"


def test_columns_and_rows_match_what_bench_writes_now(text):
    """把一份假结果交给 bench.render，解析出来的表头和行名必须和文件里的一样：脚本改了列，文件就要重新生成。
    llama.cpp 那一行只在给了 --llama-bench 时才有：假结果按文件里有没有它来造。"""
    times, ratios = parse(text)
    keys = [k for k in bench.ROWS if k != "llama" or bench.ROWS["llama"] in [r[0] for r in times]]
    fake = {k: fake_timing() for k in keys}
    meta = fake_meta() | {"fma_rate": "1e11", "fma_how": "x", "macs": "1000000"}
    want_times, want_ratios = parse(bench.render(fake, meta))
    assert [r[0] for r in floors(text)] == [r[0] for r in floors(bench.render(fake, meta))]
    assert times[0] == want_times[0] == bench.COLUMNS and ratios[0] == bench.RATIO_COLUMNS
    assert [r[0] for r in times] == [r[0] for r in want_times]
    assert [r[0] for r in ratios] == [r[0] for r in want_ratios]
    targets = {bench.RATIOS[k]: v for k, v in bench.TARGETS.items()}
    assert all(r[3] == targets.get(r[0], "") for r in ratios[1:]), "目标一列要和 bench.TARGETS 一致"


def test_floors_table_agrees_with_the_fma_rate_and_the_other_tables(text):
    """两个下限的表：算的下限 = 乘加次数 / 抬头那句的峰值，随 batch 成倍涨；读的下限每行相同、等于时间表的下限一行；
    "两者大的"是两者里大的；Engine 的 bs=1、bs=4 和时间表同一格；最后一列 = Engine / 两者大的。
    这张表在 <!-- --8<-- [start:floors] --> 一段里：附录单独引用它。"""
    assert "<!-- --8<-- [start:floors] -->" in text and "<!-- --8<-- [end:floors] -->" in text
    m = re.search(r"乘加的峰值 (\d+) G 次/秒（C\+\+ 的 fma_peak：\d+ 个线程", text)
    assert m, "缺少乘加峰值那一句"
    rate = float(m[1])
    table = floors(text)
    assert table[0] == bench.FLOOR_COLUMNS and [int(r[0]) for r in table[1:]] == list(bench.FLOOR_BATCHES)
    times, _ = parse(text)
    rows = {r[0]: r for r in times}
    read_floor, engine = float(rows[bench.ROWS["floor"]][1]), rows[bench.ROWS["engine"]]
    for bs, (gmacs, fma, read, top, eng, ratio) in ((int(r[0]), map(num, r[1:])) for r in table[1:]):
        assert gmacs == pytest.approx(bs * float(table[1][1]), abs=0.005 * bs + 0.006), "乘加次数 = bs × 一个请求的"
        assert fma == pytest.approx(gmacs / rate * 1e3, rel=0.5 / rate + 0.05 / gmacs + 1e-3, abs=0.06)
        assert read == read_floor and top == max(fma, read)
        if bs in bench.BATCH_SIZES:
            assert eng == float(engine[1 + bench.BATCH_SIZES.index(bs)]), f"bs={bs} 的 Engine 要和时间表同一格"
        assert ratio == pytest.approx(eng / top, rel=_rounding(eng, top), abs=0.006)


def test_without_the_kernel_the_floors_table_says_why():
    """C++ 核用不了时量不到核的乘加峰值：那一段只有一句为什么，没有表（不拿别的数凑一张）。"""
    fake = {k: fake_timing() for k in ("floor", "skeleton", "hf", "engine")}
    meta = fake_meta()
    text = bench.render(fake, meta)
    assert len(tables(text)) == 2 and "两个下限：C++ 核用不了（线性层走 F.linear），量不到核的乘加峰值" in text
    row = bench.floor_rows(fake, 10 ** 9, 1e11)[2]  # bs=1：10 ms 的乘加、100 ms 的读、Engine 100 ms
    assert row == "| 1 | 1.00 | 10.0 | 100.0 | 100.0 | 100.0 | 1.00 |"


def test_ratios_and_throughput_agree_with_the_times(text):
    times, ratios = parse(text)
    rows = {r[0]: [num(c) for c in r[1:]] for r in times[1:]}
    floor, skeleton, hf, engine = (rows[bench.ROWS[k]] for k in ("floor", "skeleton", "hf", "engine"))
    llama = rows.get(bench.ROWS["llama"])
    assert floor[0] == floor[1], "下限和 batch 大小无关：bs=1、bs=4 应该相同"
    for name, (d1, d4, _p1, _p4, tps1, tps4) in rows.items():  # prefill 两列：1×32、4×32 的提示词
        if name in (bench.ROWS["skeleton"], bench.ROWS["llama"]) and d1 is None:
            continue  # 骨架只会 Qwen3；llama.cpp 只量 bs=1 的 decode
        assert d1 is not None and tps1 == pytest.approx(1000 / d1, rel=_rounding(d1), abs=0.06), name
        if d4 is not None:
            assert tps4 == pytest.approx(4000 / d4, rel=_rounding(d4), abs=0.06), name
    assert engine[2] is not None and hf[2] is not None  # prefill 都量了
    assert (skeleton[0] is None) == (skeleton[2] is None), "骨架要么 decode、prefill 都量了，要么都不适用"
    slack = {"engine/floor": (_rounding(engine[0], floor[0]), _rounding(engine[1], floor[1])),
             "hf/engine": (_rounding(hf[0], engine[0]), _rounding(hf[1], engine[1])),
             "skeleton/engine": (_rounding(skeleton[0], engine[0]), 0),
             "engine bs4/bs1": (_rounding(engine[1], engine[0]), 0),
             "engine/llama": (_rounding(engine[0], llama[0] if llama else None), 0),
             "hf/engine prefill": (_rounding(hf[2], engine[2]), _rounding(hf[3], engine[3])),
             "engine/llama prefill": (_rounding(engine[2], llama and llama[2]),
                                      _rounding(engine[3], llama and llama[3]))}
    expected = {"engine/floor": (engine[0] / floor[0], engine[1] / floor[1]),
                "hf/engine": (hf[0] / engine[0], hf[1] / engine[1]),
                "skeleton/engine": (None if skeleton[0] is None else skeleton[0] / engine[0], None),
                "engine bs4/bs1": (engine[1] / engine[0], None),
                "hf/engine prefill": (hf[2] / engine[2], hf[3] / engine[3])}
    if llama is not None:
        expected["engine/llama"] = (engine[0] / llama[0], None)
        expected["engine/llama prefill"] = (engine[2] / llama[2], engine[3] / llama[3])
    written = {r[0]: (num(r[1]), num(r[2])) for r in ratios[1:]}
    for key, label in bench.RATIOS.items():
        if key not in expected:
            assert label not in written, label
            continue
        for got, want, rel in zip(written[label], expected[key], slack[key]):
            assert (got is None) == (want is None), label
            if want is not None:
                assert got == pytest.approx(want, rel=rel, abs=0.006), label


def _rounding(*shown: float | None) -> float:
    """表里的毫秒数只留一位小数（±0.05）：由它们算出的比值、吞吐最多偏这么多（相对），再加一点余量。"""
    return sum(0.05 / x for x in shown if x) + 1e-3


def test_peer_line_agrees_with_the_llama_row(text):
    """有 llama.cpp 那一行时，表下面折合的读带宽 = 权重 MiB / 它的 decode 每步用时，"比下限还快"的判断和数对得上。"""
    times, _ = parse(text)
    llama = next((r for r in times if r[0] == bench.ROWS["llama"]), None)
    m = re.search(r"折合读权重 ([\d.]+) GB/s（(\d+) MiB / 每步用时），下限用的读带宽 ([\d.]+) GB/s：(.)", text)
    assert (m is None) == (llama is None), "llama.cpp 那一行和折合读带宽那一句要么都有，要么都没有"
    if m:
        peer, mib, floor, verdict = float(m[1]), int(m[2]), float(m[3]), m[4]
        assert peer == pytest.approx(mib * 2**20 / (float(llama[1]) / 1e3) / 1e9, rel=_rounding(float(llama[1])) + 2e-3)
        assert (verdict == "比") == (peer > floor), m[0]


def test_engine_faster_than_the_floor_is_said(text):
    """Engine 的 bs=1 一步比"内存带宽下限"那一行还快时（下限量在机器更忙的那一阵），表下面明说；不快时不说。"""
    times, _ = parse(text)
    rows = {r[0]: r for r in times}
    floor, engine = float(rows[bench.ROWS["floor"]][1]), float(rows[bench.ROWS["engine"]][1])
    said = re.search(r"Engine 的 decode bs=1 折合读权重 ([\d.]+) GB/s，比下限用的读带宽还快", text)
    if abs(floor - engine) > 0.1:  # 表里只留一位小数：差不到 0.1 ms 时分不出谁快
        assert (said is not None) == (engine < floor), f"Engine {engine} ms/步，下限 {floor} ms/步"


def test_memory_line_is_consistent(text):
    m = re.search(r"峰值增量：([\d.]+) GiB；权重 \+ KV 池 = ([\d.]+) GiB（差 ([+-][\d.]+) GiB）", text)
    assert m, "缺少加载 Engine 时的峰值内存那一行"
    peak, budget, over = map(float, m.groups())
    assert over == pytest.approx(peak - budget, abs=0.011)


@pytest.mark.parametrize("shapes", ["qwen3-0.6b", "smollm2"])
def test_kernel_table_is_what_bench_kernels_writes(shapes):
    """附录引用的线性层核的表（两种形状各一张）：抬头写着命令、机器和核的编译设置，列是脚本比较的几种做法，
    行是 bench.kernels.ROWS，GFLOP/s、GB/s 由行数、MiB 和 ms 算得出（只读不算的 READ_ONLY 两列没有 GFLOP/s）。"""
    from tools.bench import kernels as bench_kernels

    path = bench_kernels.SNIPPETS[shapes]
    assert path.is_file(), f"{path} 不存在：运行 {bench_kernels.COMMANDS[shapes]} 生成它"
    text = path.read_text(encoding="utf-8")
    assert f"命令：`{bench_kernels.COMMANDS[shapes]}`" in text
    assert re.search(r"日期：\d{4}-\d\d-\d\d \d\d:\d\d UTC", text)
    assert re.search(r"机器：.+（.+；L3 .+），\d+ 核；torch \d+\.\d+\S*，\d+ 个线程", text)
    assert re.search(r"minisgl.kernel：C\+\+ small_linear（.+）", text), "写明跑的是 C++ 核和它的向量宽度、分块"
    assert f"{shapes} 的 {bench_kernels.LAYERS[shapes]} 层线性层" in text
    mib = float(re.search(r"fp32 权重 (\d+) MiB", text).group(1))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not re.fullmatch(r"\|(---\|)+", line)]
    assert rows[0] == bench_kernels.COLUMNS
    assert [r[0] for r in rows[1:]] == [str(n) for n in bench_kernels.ROWS]
    for r in rows[1:]:
        for name, cell in zip(rows[0][1:], r[1:]):
            m = re.fullmatch(r"([\d.]+) ms，(?:(\d+) GFLOP/s，)?([\d.]+) GB/s", cell)
            assert m and (m[2] is None) == (name in bench_kernels.READ_ONLY), cell
            ms, gbps = float(m[1]), float(m[3])
            assert gbps == pytest.approx(mib * 2**20 / (ms / 1e3) / 1e9, rel=0.01, abs=0.06), cell
            if m[2]:  # 2·行数·权重个数 / 秒；表里取整到 1 GFLOP/s，ms 取到 0.1、MiB 取到整数：误差是三者舍入之和
                want = 2 * int(r[0]) * mib * 2**20 / 4 / (ms / 1e3) / 1e9
                assert float(m[2]) == pytest.approx(want, abs=0.5 + want * (0.05 / ms + 0.5 / mib) + 1e-9), cell


@pytest.mark.parametrize("engine_ms, llama_ms, said", [(9.0, 12.0, "engine"), (11.0, 9.0, "llama"), (11.0, 12.0, None),
                                                       (9.0, 8.0, "both")])
def test_peer_line_says_who_reads_faster_than_the_floor(engine_ms, llama_ms, said):
    """下限 1 GB/s、权重 10 MB（下限 10 ms/步）：谁的 bs=1 一步比它快，表下面就说谁；llama.cpp 那句总在。"""
    from tools.bench.__main__ import Measured, peer_line

    results = {"engine": Timing({1: engine_ms / 1e3}), "llama": Timing({1: llama_ms / 1e3})}
    text = peer_line(Measured(results, "1.0 GB/s", 1.0, "", ""), 10 ** 7)
    assert "llama.cpp 的 decode bs=1 折合读权重" in text
    assert ("下限不是真的下限" in text) == (said in ("llama", "both")), text
    assert ("Engine 的 decode bs=1 折合读权重" in text) == (said in ("engine", "both")), text


def _round_values(line: str, labels: dict[str, str], repeat: int) -> dict[str, list[float]]:
    """一句"同一轮里紧挨着量的一对"里每个标签的各轮之比：个数 = 轮数，中位数由这几个数算得出。"""
    import statistics

    found = {}
    for key, label in labels.items():
        m = re.search(rf"{re.escape(label)}各轮是 ([\d.、]+)，中位数 ([\d.]+)", line)
        if m:
            values = [float(x) for x in m[1].split("、")]
            assert len(values) == repeat, f"{label}：{len(values)} 个数，抬头说 {repeat} 轮"
            assert float(m[2]) == pytest.approx(statistics.median(values), abs=0.0051), m[0]
            found[key] = values
    return found


def test_pairs_line_lists_every_round_and_its_median(text):
    """比值表下面那一句：每一对（Engine bs=4 / bs=1；有 llama.cpp 时 Engine / llama.cpp）各轮一个数，轮数 = 抬头写的
    "每项 N 轮"，中位数由这几个数算得出；和比值表里"各自最快的一轮"之比的差，就是机器在几轮之间的起伏。
    两个下限的表下面也有一句：每轮 Engine bs=4 / 同一轮量的两个下限里大的。"""
    repeat = int(re.search(r"每项 (\d+) 轮取最快", text).group(1))
    times, _ = parse(text)
    has_llama = any(r[0] == bench.ROWS["llama"] for r in times)
    head, _, rest = text.partition("<!-- --8<-- [start:floors] -->")
    section = rest.partition("<!-- --8<-- [end:floors] -->")[0]
    lines = [s for s in head.splitlines() if s.startswith("同一轮里紧挨着量的一对")]
    assert len(lines) == 1, "比值表下面缺少每轮紧挨着量的一对之比那一句"
    found = _round_values(lines[0], bench.PAIRS, repeat)
    assert set(found) == ({"engine bs4/bs1", "engine/llama"} if has_llama else {"engine bs4/bs1"}), lines[0]
    lines = [s for s in section.splitlines() if s.startswith("同一轮里紧挨着量的一对")]
    assert len(lines) == 1 and "上面的两个下限的表" in lines[0], "两个下限的表下面缺少每轮的 Engine bs=4 / 大的"
    assert set(_round_values(lines[0], bench.FLOOR_PAIRS, repeat)) == set(bench.FLOOR_PAIRS), lines[0]


def test_pairs_line_takes_each_round_as_measured():
    """pairs_line 只排版：给什么数就写什么数，中位数照算；只写 labels 里有的键；没有数时不写这一句。"""
    pairs = {"engine bs4/bs1": [1.2, 1.0, 1.1], "engine/llama": [0.9, 0.95], "engine bs4/floor": [1.3, 1.1]}
    line = bench.pairs_line(pairs)
    assert "Engine 的 bs=4 步 / bs=1 步各轮是 1.20、1.00、1.10，中位数 1.10" in line
    assert "Engine / llama.cpp（decode bs=1）各轮是 0.90、0.95，中位数 0.93" in line
    assert bench.FLOOR_PAIRS["engine bs4/floor"] not in line
    line = bench.pairs_line(pairs, bench.FLOOR_PAIRS, "两个下限的表")
    assert line.startswith("同一轮里紧挨着量的一对（上面的两个下限的表")
    assert f"{bench.FLOOR_PAIRS['engine bs4/floor']}各轮是 1.30、1.10，中位数 1.20" in line and "bs=1 步" not in line
    assert bench.pairs_line({"engine bs4/bs1": []}) == ""


def test_kernel_threads_table_is_what_bench_threads_writes():
    """docs/snippets/kernel_threads.md（python -m tools.bench.threads）：抬头写着命令、日期、机器和负载；
    行就是三种编法；比值列用表里的毫秒数算得出来；同一轮的比值每轮一个、中位数对得上。"""
    import statistics

    from tools.bench import threads

    text = threads.SNIPPET.read_text(encoding="utf-8")
    assert f"命令：`{threads.COMMAND}`" in text and re.search(r"日期：\d{4}-\d\d-\d\d \d\d:\d\d UTC", text)
    assert re.search(r"机器：.+（.+；L3 .+），\d+ 核；torch \S+，\d+ 个线程", text) and "平均负载" in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not re.fullmatch(r"\|(---\|)+", line)][1:]
    assert [r[0] for r in rows] == list(threads.VARIANTS)
    base = [float(x) for x in rows[0][1:3]]
    for r in rows:
        assert r[3] == " / ".join(f"{float(x) / b:.2f}" for x, b in zip(r[1:3], base)), r
    for bs in threads.BATCH_SIZES:
        m = re.search(rf"bs={bs} 各轮是 ([\d.、]+)，中位数 ([\d.]+)", text)
        assert m, f"缺 bs={bs} 同一轮的比值"
        v = [float(x) for x in m.group(1).split("、")]
        assert f"{statistics.median(v):.2f}" == m.group(2)  # 用写出来的（两位小数的）比值算


@pytest.mark.parametrize("tied", [True, False])
def test_matmul_macs_counts_each_matmul_weight_once(tied):
    """一个请求一步的乘加次数：线性层和 LM head 的权重元素各一次；词嵌入是查表，没绑定时不算，绑定时那一份就是 LM head；
    一维的（norm 的权重、bias）不是矩阵乘。"""
    from types import SimpleNamespace

    import torch

    from tools.bench.floors import matmul_macs

    weights = {"model.embed_tokens.weight": torch.empty(100, 8), "model.layers.0.qkv_proj.weight": torch.empty(24, 8),
               "model.layers.0.input_layernorm.weight": torch.empty(8), "model.norm.weight": torch.empty(8)}
    if not tied:
        weights["lm_head.weight"] = torch.empty(100, 8)
    engine = SimpleNamespace(config=SimpleNamespace(model_config=SimpleNamespace(tie_word_embeddings=tied)),
                             model=SimpleNamespace(state_dict=lambda: weights))
    assert matmul_macs(engine) == 100 * 8 + 24 * 8
