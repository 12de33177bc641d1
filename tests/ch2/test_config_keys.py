"""第 2 章起：config.json 只剩页面上那张表里的键（tests/ch2/config_keys.toml），生成的 token 照样不变。

两个 Qwen3 小模型各一种写法：qwen3-tied 是 transformers 5 的新形式（rope_theta 只在 rope_parameters 里），
qwen3-untied 是老形式（rope_theta 在顶层），它不绑定词嵌入，tie_word_embeddings 也删掉（缺了就是不绑定）。
head_dim 留着：第 3 章起 config.json 由 transformers 读，Qwen3 的配置类缺了它时取 128，不是算出来的。
"""

import json

import pytest

from tests.ch1.common import cli, copy_model
from tools.book.config_keys import minimal_config

# 第 3 章起按 architectures 选模型类（第 3 章任务 1 的必需字段）：留着它，同一个测试在后面各章照跑
KEEP = ("architectures",)


@pytest.mark.parametrize("name", ["qwen3-tied", "qwen3-untied"])
def test_config_with_only_the_listed_keys_gives_the_same_tokens(checkpoint, tiny_models, tmp_path, name):
    src = tiny_models[name]
    full = json.loads((src / "config.json").read_text())
    small = minimal_config("ch2", full, KEEP)
    if small.get("tie_word_embeddings") is False:
        del small["tie_word_embeddings"]  # 缺了就是不绑定
    model = copy_model(src, tmp_path / "m")
    (model / "config.json").write_text(json.dumps(small))
    args = ["--prompt", "Hi", "--max-new-tokens", "4", "--json"]
    want, got = cli(checkpoint, ["--model", str(src), *args]), cli(checkpoint, ["--model", str(model), *args])
    assert want.returncode == 0, want.stderr[-500:]
    assert got.returncode == 0, f"config.json 只剩 {sorted(small)} 时跑不起来：{got.stderr.strip()[-300:]}"
    assert got.stdout.splitlines()[-1] == want.stdout.splitlines()[-1], \
        f"config.json 只剩 {sorted(small)} 时生成的 token 变了"
