"""第 2 章：加载时 config 和权重对不上要报错并说出张量；超出 RoPE 表的位置在建 Req 时就拒绝。"""

import json
import re

import pytest

from tests.ch1.common import copy_model, load_generate, only_generate_of_ch1_ch2
from tests.harness.contract import run_subprocess

# 第 2 章的 load_model 说"张量 KEY："，第 3 章起的加载器说"FILE 里的 KEY（引擎里的 NAME）："
SHARD_ERROR = re.compile(r"(?:张量 |里的 )(\S+?)(?:（引擎里的 \S+?）)?："
                         r"检查点里的形状是 (\(.*?\))，按 config 应当是 (\(.*?\))")


@pytest.mark.parametrize("field, value, allowed", [
    ("vocab_size", 200, {("model.embed_tokens.weight", "(1024, 64)", "(200, 64)")}),
    ("num_key_value_heads", 1, {(f"model.layers.{i}.self_attn.{p}_proj.weight", "(32, 64)", "(16, 64)")
                                for i in range(3) for p in "kv"}),
    ("intermediate_size", 64, {(f"model.layers.{i}.mlp.{p}_proj.weight", got, "(64, 64)") for i in range(3)
                               for p, got in [("gate", "(128, 64)"), ("up", "(128, 64)"), ("down", "(64, 128)")]}),
])
def test_config_smaller_than_weights_is_refused(checkpoint, tiny_models, tmp_path, field, value, allowed):
    """HF 这时报 size mismatch；悄悄截掉多出来的行或列会跑出别的 token。"""
    model = copy_model(tiny_models["qwen3-tied"], tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config[field] = value
    (model / "config.json").write_text(json.dumps(config))
    res = run_subprocess(checkpoint.entry_path, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", "2"])
    assert res.returncode != 0
    m = SHARD_ERROR.search(res.stderr)
    assert m and m.groups() in allowed, res.stderr[-2000:]


def test_positions_past_the_rope_table_are_refused(checkpoint):
    only_generate_of_ch1_ch2(checkpoint)
    gen = load_generate(checkpoint)
    gen.make_req([1, 2], 511, 0, 1024, 512)  # 用到的最后一个位置是 511：正好在表里
    with pytest.raises(ValueError) as e:
        gen.make_req([1, 2], 512, 0, 1024, 512)
    assert "max_position_embeddings=512" in str(e.value)
