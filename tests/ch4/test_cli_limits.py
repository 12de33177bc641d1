"""第 4 章起 generate.py 的命令行：在加载模型之前（或者生成之前）就拒绝用不了的输入，
错误以 错误：/ error: 开头、说出是哪个参数和规则，不打印回溯。"""

import shutil

import pytest

from tests.harness.contract import run_subprocess


def refused(checkpoint, model, *args: str) -> str:
    res = run_subprocess(checkpoint.entry_path, ["--model", str(model), *args], timeout=300)
    assert res.returncode != 0, res.stdout[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return res.stderr


def test_max_seq_len_rule_is_stated(checkpoint, tiny_models):
    """提示词 "Hello" 在小模型的分词器里是 1 个 token：1 + 5 = 6 > 5。"""
    err = refused(checkpoint, tiny_models["qwen3-tied"], "--prompt", "Hello", "--max-new-tokens", "5",
                  "--max-seq-len", "5")
    assert "--max-seq-len 5" in err and "提示词 token 数 + --max-new-tokens <= --max-seq-len" in err, err


@pytest.mark.parametrize("big_page", ["100000000", "64"])
def test_page_size_beyond_the_sequence_is_refused(checkpoint, tiny_models, big_page):
    err = refused(checkpoint, tiny_models["qwen3-tied"], "--prompt", "Hello", "--max-new-tokens", "4",
                  "--max-seq-len", "32", "--page-size", big_page)
    assert f"--page-size {big_page}" in err and "--max-seq-len 32" in err, err


def test_empty_prompt_names_the_prompt(checkpoint, tiny_models):
    err = refused(checkpoint, tiny_models["qwen3-tied"], "--prompt", "Hello", "--prompt", "")
    assert "--prompt ''" in err and "0 个 token" in err, err


def test_missing_tokenizer_names_the_files(checkpoint, tiny_models, tmp_path):
    model = tmp_path / "no_tokenizer"
    model.mkdir()
    for f in tiny_models["qwen3-tied"].iterdir():
        if not f.name.startswith("tokenizer"):
            shutil.copy(f, model / f.name)
    err = refused(checkpoint, model, "--prompt", "Hello")
    assert "分词器" in err and "tokenizer.json" in err and str(model) in err, err


def test_dump_logits_to_a_directory_is_refused_before_generating(checkpoint, tiny_models, tmp_path):
    err = refused(checkpoint, tiny_models["qwen3-tied"], "--prompt", "Hello", "--dump-logits", str(tmp_path))
    assert "--dump-logits" in err and str(tmp_path) in err, err


def test_pool_too_small_says_so_without_a_traceback(checkpoint, tiny_models):
    err = refused(checkpoint, tiny_models["qwen3-tied"], "--prompt", "Hello", "--num-pages", "1")
    assert err.strip().startswith("错误：") and ("--num-pages" in err or "max_seq_len=1" in err), err
