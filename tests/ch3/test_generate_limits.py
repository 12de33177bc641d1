"""第 3 章起：超出 RoPE 表的位置在生成之前就拒绝，说出 max_position_embeddings（而不是前向里的 IndexError）。"""

import json

from tests.ch1.common import cli
from tests.harness.errors import expect_exit


def test_positions_past_max_position_embeddings_are_refused(checkpoint, tiny_models, family):
    """每个小模型的 max_position_embeddings 不同（256、384、512、1024）：上限写死成一个数的实现在别的模型上放过越界。"""
    model = tiny_models[family]
    limit = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    res = cli(checkpoint, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", str(limit + 1)])
    expect_exit("ch3/cli_max_position", res)
