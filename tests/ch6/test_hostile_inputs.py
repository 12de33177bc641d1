"""第 6 章：generate.py 遇到坏输入只打印一行 错误：…，说出是哪个文件、字段或上限，从不打印 Traceback。

坏的模型目录（配置和权重对不上、transformers 不接受的配置、截断的权重、只有 pickle…）和坏的命令行参数，
每种起一个子进程，像读者那样运行；子进程同时起，省掉等待。
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.harness.procs import collect

MODEL = "qwen3-tied"


def _edit_config(path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _truncate(path) -> None:
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])


def _pickle_only(path) -> None:
    (path / "model.safetensors").rename(path / "pytorch_model.bin")


def _bad_json(path) -> None:
    (path / "config.json").write_text("{not json")


# 名字 -> (怎么弄坏模型目录, 额外的命令行参数, 错误那一行必须写出的片段)
CASES = {
    "more_layers_than_weights": (lambda p: _edit_config(p, num_hidden_layers=5, layer_types=["full_attention"] * 5),
                                 [], "q_proj"),
    "transformers_rejects_config": (lambda p: _edit_config(p, num_hidden_layers=5), [], "layer_types"),
    "rope_parameters_incomplete": (lambda p: _edit_config(p, rope_parameters={"rope_type": "llama3",
                                                                              "rope_theta": 1e6}), [], "factor"),
    "config_not_json": (_bad_json, [], "config.json"),
    "unsupported_architecture": (lambda p: _edit_config(p, architectures=["MixtralForCausalLM"]), [],
                                 "MixtralForCausalLM"),
    "truncated_weights": (_truncate, [], "model.safetensors"),
    "pickle_only": (_pickle_only, [], "pickle"),
    "tp_cannot_cut": (None, ["--tp", "3"], "tp=3"),
    "prompt_longer_than_max_seq_len": (None, ["--max-seq-len", "2"], "--max-seq-len"),
    "page_size_zero": (None, ["--page-size", "0"], "--page-size"),
    "unknown_flag": (None, ["--bogus"], "--bogus"),
    "unknown_backend": (None, ["--attention-backend", "flash"], "'flash'"),
    "tp_worker_error": (None, ["--tp", "2", "--num-pages", "1"], "max_seq_len=1"),  # worker 的 traceback 只留最后一行
}


@pytest.fixture(scope="module")
def runs(checkpoint, tiny_models, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=str(checkpoint.path), OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    procs = {}
    for name, (breaker, flags, _) in CASES.items():
        model = tiny_models[MODEL]
        if breaker is not None:
            model = shutil.copytree(model, tmp_path_factory.mktemp(name) / "m")
            breaker(model)
        argv = [sys.executable, str(checkpoint.entry_path), "--model", str(model), "--prompt", "你好",
                "--max-new-tokens", "2", *flags]
        procs[name] = subprocess.Popen(argv, cwd=checkpoint.path, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace")
    return collect(procs, timeout=300)


@pytest.mark.parametrize("name", list(CASES))
def test_task6_hostile_input_is_one_error_line(runs, name):
    res, culprit = runs[name], CASES[name][2]
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0, f"{name}：坏输入却正常退出了\n{res.stdout[-2000:]}"
    assert "Traceback" not in res.stderr, f"{name}：打印了 Traceback\n{res.stderr[-3000:]}"
    assert lines and lines[-1].startswith("错误："), f"{name}：最后一行不是 错误：…\n{res.stderr[-2000:]}"
    assert culprit in lines[-1], f"{name}：错误那一行没写出 {culprit!r}：{lines[-1]}"
