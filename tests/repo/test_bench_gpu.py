"""tools.bench.gpu：GPU 上的表。没有 CUDA 的机器上测得到的两件事：说一行就退出，以及表里的数都由输入算出。"""

from __future__ import annotations

import pytest
import torch

from tools.bench import gpu


def test_without_cuda_it_says_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("这台机器有 CUDA：真的测，见 python -m tools.bench.gpu --random-qwen3-0.6b")
    assert gpu.main(["--random-qwen3-0.6b", "--out", ""]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("错误：") and "CUDA" in out[0]


def test_table_is_computed_from_the_measurements():
    """下限 = 权重字节数 / 拷贝速度，每一列一样；ms/步保留一位小数。"""
    text = gpu.render("GPU X", weights=2 * 10**9, bandwidth=4e12, engine={1: 0.0021, 64: 0.0049},
                      eager={1: 0.0257, 64: 0.0224}, hf={1: 0.0307, 64: 0.0262}, steps=31)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["decode ms/步"] == ["bs 1", "bs 64"]
    assert rows["第 6 章的 Engine，CUDA 图"] == ["2.1", "4.9"]
    assert rows["第 6 章的 Engine，不录图"] == ["25.7", "22.4"]
    assert rows["HF transformers（eager）"] == ["30.7", "26.2"]
    assert rows["下限：权重读一遍"] == ["0.50", "0.50"]
    assert "GPU X" in text and "4.00 TB/s" in text
