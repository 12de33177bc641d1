"""第 2 章：加载时 config 和权重对不上要报错并说出张量；超出 RoPE 表的位置在建 Req 时就拒绝。"""

import json

import pytest

from tests.ch1.common import cli, copy_model, load_generate, only_generate_of_ch1_ch2
from tests.harness.errors import expect_error, expect_exit


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
    res = cli(checkpoint, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", "2"])
    expect_exit("ch2/config_smaller_than_weights", res,
                one_of=[dict(tensor=key, full=full, expected=want) for key, full, want in sorted(allowed)])


def test_positions_past_the_rope_table_are_refused(checkpoint):
    only_generate_of_ch1_ch2(checkpoint, "tests/ch3/test_generate_limits.py::test_the_position_limit_is_exact")
    gen = load_generate(checkpoint)
    gen.make_req([1, 2], 511, 0, 1024, 512)  # 用到的最后一个位置是 511：正好在表里
    with expect_error("ch2/max_position", max_position=512):
        gen.make_req([1, 2], 512, 0, 1024, 512)
