"""第 1 章起：输入在建 batch 的地方查，用主机上的整数（前向里不查，也就没有每步一次的同步）。

空的提示词、找不到分词器、词表之外的 token id、不是浮点数的权重：都要给出说清楚的错误。
"""

import types

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.ch1.common import cli, copy_model, load_generate, only_generate_of_ch1_ch2
from tests.harness.errors import expect_error, expect_exit


def test_empty_prompt_is_refused(checkpoint, tiny_models):
    model = tiny_models[checkpoint.families[0]]
    res = cli(checkpoint, ["--model", str(model), "--prompt", "Hi", "--prompt", "", "--max-new-tokens", "2"])
    expect_exit("ch1/empty_prompt", res, prompt=repr(""))


def test_missing_tokenizer_names_the_files(checkpoint, tiny_models, tmp_path):
    src = tiny_models[checkpoint.families[0]]
    model = copy_model(src, tmp_path / "m", {f.name for f in src.iterdir() if not f.name.startswith("tokenizer")})
    res = cli(checkpoint, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", "2"])
    expect_exit("ch1/missing_tokenizer", res)


@pytest.mark.parametrize("ids", [[[1, 2], [3, 50]], [[-1, 2]], [[7, 1000, 3]]])
def test_token_id_outside_vocab_is_refused_when_req_is_made(checkpoint, ids):
    only_generate_of_ch1_ch2(checkpoint,
                             "tests/ch3/test_generate_limits.py::test_token_id_outside_vocab_is_refused_in_one_line")
    gen = load_generate(checkpoint)
    fake = types.SimpleNamespace(cfg={"vocab_size": 50, "max_position_embeddings": 512})  # 没走到前向就该拒绝
    bad = next(t for p in ids for t in p if not 0 <= t < 50)
    uid = next(i for i, p in enumerate(ids) if bad in p)
    with expect_error("ch1/token_outside_vocab", uid=uid, id=bad, vocab_size=50):
        gen.generate(fake, ids, 3)


def test_integer_weights_are_refused(checkpoint, tiny_models, tmp_path):
    """整数（量化）的权重不能被悄悄转成浮点数：报错说出是哪个张量。"""
    model = copy_model(tiny_models["qwen3-tied"], tmp_path / "m")
    weights = load_file(model / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"].round().to(torch.int8)
    save_file(weights, model / "model.safetensors")
    res = cli(checkpoint, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", "2"])
    expect_exit("ch1/integer_weights", res, tensor="model.norm.weight", dtype="int8")
