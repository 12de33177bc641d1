"""第 6 章：generate.py 遇到坏输入只打印一行 错误：…，说出是哪个文件、字段或上限，从不打印 Traceback。

坏的模型目录（配置和权重对不上、transformers 不接受的配置、截断的权重、只有 pickle…）和坏的命令行参数。
每种在本进程里按 __main__ 跑一次入口脚本（tests/harness/errors.py 的 run_cli：sys.exit 的消息进 stderr，
漏出来的异常写成 Traceback，和子进程一样），省掉每种起一个进程、import torch 的几秒；
--tp N 的两种（起进程之前就拒绝、worker 出错）真的起进程，见 test_tensor_parallel_procs.py。
大多数和进程内的同一条报错清单相同：入口脚本接住异常，把同一句消息写成 错误：… 这一行。
"""

from __future__ import annotations

import json
import shutil

import pytest

from minisgl.core import reset_global_ctx
from minisgl.distributed import reset_tp_info
from tests.harness.errors import expect_exit, run_cli

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


# 名字 -> (怎么弄坏模型目录, 额外的命令行参数, 报错清单里的哪一条, 回显；{m} 换成弄坏的模型目录)
CASES = {
    "more_layers_than_weights": (lambda p: _edit_config(p, num_hidden_layers=5, layer_types=["full_attention"] * 5),
                                 [], "ch3/more_layers_than_weights",
                                 dict(key="model.layers.3.self_attn.q_proj.weight", name="model.safetensors")),
    "transformers_rejects_config": (lambda p: _edit_config(p, num_hidden_layers=5), [], "ch6/cli_config_rejected",
                                    dict(reason="layer_types")),
    "rope_parameters_incomplete": (lambda p: _edit_config(p, rope_parameters={"rope_type": "llama3",
                                                                              "rope_theta": 1e6}),
                                   [], "ch6/cli_config_rejected", dict(reason="factor")),
    "config_not_json": (_bad_json, [], "ch3/config_not_json", dict(file="{m}/config.json")),
    "unsupported_architecture": (lambda p: _edit_config(p, architectures=["MixtralForCausalLM"]), [],
                                 "ch3/config_unsupported_architecture",
                                 dict(file="{m}/config.json", arch="MixtralForCausalLM")),
    "truncated_weights": (_truncate, [], "ch3/corrupt_safetensors", dict(file="{m}/model.safetensors")),
    "pickle_only": (_pickle_only, [], "ch3/pickle_only", dict(name="pytorch_model.bin")),
    "prompt_longer_than_max_seq_len": (None, ["--max-seq-len", "2"], "ch4/max_seq_len_rule", dict(max_seq_len=2)),
    "page_size_zero": (None, ["--page-size", "0"], "ch4/sizes_not_positive", dict(name="--page-size")),
    "unknown_flag": (None, ["--bogus"], "checkpoint/unknown_flag", dict(flag="--bogus")),
    "unknown_backend": (None, ["--attention-backend", "flash"], "ch5/unknown_backend", dict(name="'flash'")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_task6_hostile_input_is_one_error_line(checkpoint, tiny_models, tmp_path, name):
    breaker, flags, case_id, values = CASES[name]
    model = tiny_models[MODEL]
    if breaker is not None:
        model = shutil.copytree(model, tmp_path / "m")
        breaker(model)
    argv = ["--model", str(model), "--prompt", "你好", "--max-new-tokens", "2", *flags]
    try:
        res = run_cli(checkpoint.entry_path, argv)
    finally:
        reset_global_ctx()  # 出错时入口脚本可能没来得及清理
        reset_tp_info()
    expect_exit(case_id, res, **{k: str(v).replace("{m}", str(model)) for k, v in values.items()})


def test_task6_tp1_errors_read_like_tp_n(checkpoint, tiny_models):
    """--num-pages 1：池只有一页，add_req 放不下。--tp 1 出错时和 --tp N（test_tensor_parallel_procs.py）一样只打印
    错误：…，不是裸的回溯。"""
    res = run_cli(checkpoint.entry_path, ["--model", str(tiny_models[MODEL]), "--prompt", "Hello", "--num-pages", "1"])
    expect_exit("ch6/cli_pool_too_small", res)
