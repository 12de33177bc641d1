"""第 3 章起：生成之前就拒绝 RoPE 表放不下的位置、词表之外的 token id，一行 错误：…（而不是前向里的 IndexError）。

两个上限都查到正好那一个：上限本身照常生成，多一个就拒绝（> 和 >= 写错一个都过不了）。
第 1、2 章调 make_req 的同类测试从第 3 章起跳过，跳过的原因点名这里的测试。
"""

import json

from transformers import AutoTokenizer

from tests.ch1.common import cli, copy_model
from tests.harness.errors import expect_exit

FILLER = "<|im_start|>"  # 小模型分词器的特殊 token：重复 k 次正好编码成 k 个 token


def test_positions_past_max_position_embeddings_are_refused(checkpoint, tiny_models, family):
    """每个小模型的 max_position_embeddings 不同（256、384、512、1024）：上限写死成一个数的实现在别的模型上放过越界。"""
    model = tiny_models[family]
    limit = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    res = cli(checkpoint, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", str(limit + 1)])
    expect_exit("ch3/cli_max_position", res)


def _prompt_of(model, k: int) -> str:
    prompt = FILLER * k
    got = len(AutoTokenizer.from_pretrained(model)(prompt).input_ids)
    assert got == k, "小模型的分词器变了：FILLER 不再是一个 token"
    return prompt


def test_the_position_limit_is_exact(checkpoint, tiny_models, family):
    """正好用满 max_position_embeddings 个位置照常生成，多一个就拒绝。第 3 章最后采出的 token 不再前向，
    最长的请求用 提示词 token 数 + n − 1 个位置；第 4 章起按 max_seq_len = 提示词 token 数 + n 算（第 4 章的规则）。"""
    model = tiny_models[family]
    limit = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    n = 2
    longest = limit - n + (1 if checkpoint.chapter == 3 else 0)  # 正好用满的提示词长度
    ok = cli(checkpoint, ["--model", str(model), "--prompt", _prompt_of(model, longest), "--max-new-tokens", str(n),
                          "--json"])
    assert ok.returncode == 0, f"正好用满 {limit} 个位置却被拒绝了：{ok.stderr.strip().splitlines()[-1:]}"
    assert [len(o) for o in json.loads(ok.stdout.strip().splitlines()[-1])["outputs"]] == [n]
    too_long = _prompt_of(model, longest + 1)
    res = cli(checkpoint, ["--model", str(model), "--prompt", too_long, "--max-new-tokens", str(n)])
    expect_exit("ch3/cli_max_position", res)


def test_token_id_outside_vocab_is_refused_in_one_line(checkpoint, tiny_models, tmp_path):
    """分词器和 config.json 对不上：qwen3-untied 的 vocab_size 是 1056，分词器只有 1024 个 token。往分词器里
    加 34 个 token：id 1055（vocab_size − 1）照常生成；1056（正好 vocab_size）、1057 都在生成之前拒绝，一行说出 id。"""
    model = copy_model(tiny_models["qwen3-untied"], tmp_path / "m")
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    tok = AutoTokenizer.from_pretrained(model)
    extra = [f"<|extra_{i}|>" for i in range(vocab_size + 2 - len(tok))]
    tok.add_tokens(extra, special_tokens=True)
    tok.save_pretrained(model)
    ids = {t: AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(t) for t in extra[-3:]}
    assert sorted(ids.values()) == [vocab_size - 1, vocab_size, vocab_size + 1], ids
    last_ok, first_bad, second_bad = extra[-3:]
    ok = cli(checkpoint, ["--model", str(model), "--prompt", f"Hi{last_ok}", "--max-new-tokens", "2", "--json"])
    assert ok.returncode == 0, f"id {vocab_size - 1}（vocab_size − 1）却被拒绝了：{ok.stderr.strip().splitlines()[-1:]}"
    for bad in (first_bad, second_bad):
        res = cli(checkpoint, ["--model", str(model), "--prompt", f"Hi{bad}", "--max-new-tokens", "2"])
        expect_exit("ch3/cli_token_outside_vocab", res, id=ids[bad], vocab_size=vocab_size)
