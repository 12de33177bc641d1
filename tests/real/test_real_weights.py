"""真权重一档：真模型上逐 token 对齐 HF。7 条提示词（英文、中文、代码、长提示词）放进一个 batch，
每条 32 个新 token，用检查点支持的最大页大小（第 4 章起 16：长提示词跨好几页）跑一次；token 和每一步的 logits 都比。
页大小不改变结果由小模型一档在每个页大小上查（四个家族的对齐测试、test_task3_page_size_invariance）：真权重
在别的页大小上再跑一遍，说不出新东西，只多花一个 30 层模型的生成。"""

import json

import pytest
from safetensors import safe_open

from tests.harness.parity import parity_failures
from tests.harness.real import REAL_NEW_TOKENS, REAL_PROMPTS
from tools.models.find import SMOLLM2
from tests.harness.reference import hf_greedy, load_tokenizer


def test_real_weights_parity(checkpoint, real_model):
    """token 逐个相同，每一步的 logits 在容差之内（一次调用同时取回两者，见 tests/harness/parity.py）。"""
    failures = parity_failures(checkpoint.entry_path, real_model, REAL_PROMPTS, REAL_NEW_TOKENS,
                               max(checkpoint.page_sizes))
    assert not failures, "\n\n".join(failures)


def test_real_model_speaks(real_model):
    """权重真的是训练过的：HF 自己在这个目录上就答得出法国的首都（做模型的工具把 GGUF 读错时这里先失败）。"""
    tokens = hf_greedy(str(real_model), REAL_PROMPTS[0], REAL_NEW_TOKENS)[0]
    text = load_tokenizer(str(real_model)).decode(tokens)
    assert "Paris" in text, f"{real_model}：{REAL_PROMPTS[0]!r} -> {text!r}"


def test_smollm2_layout(real_model):
    """tools/models/make_smollm2.py 写出的是普通 fp32 HF 检查点：没有量化配置，绑定的输出头不存第二份。"""
    if real_model.resolve() != SMOLLM2.resolve():
        pytest.skip(f"这一项只查 tools/models/make_smollm2.py 写出的 {SMOLLM2.name}；这次用的是 {real_model}")
    config = json.loads((real_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"], config
    assert "quantization_config" not in config, config
    assert config["tie_word_embeddings"]
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    with safe_open(str(real_model / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert "lm_head.weight" not in keys, sorted(keys)[:5]
    assert "model.embed_tokens.weight" in keys, sorted(keys)[:5]
    assert len(keys) == 272, sorted(keys)[:5]
    assert dtypes == {"F32"}, dtypes
