"""第 4 章起 generate.py 的命令行：在加载模型之前（或者生成之前）就拒绝用不了的输入，
错误以 错误：/ error: 开头、说出是哪个参数和规则，不打印回溯。

在本进程里按 __main__ 运行入口脚本（tests/harness/errors.py 的 run_cli：sys.exit 的消息进 stderr，漏出来的
异常写成 Traceback，和子进程一样），省掉每次起进程、import torch 的几秒；真的起子进程的一次在 test_kv_pool.py。"""

import shutil

import pytest

from minisgl.core import reset_global_ctx
from minisgl.distributed import reset_tp_info
from tests.harness.errors import expect_exit, run_cli


def refused(checkpoint, model, case: str, *args: str, **values) -> None:
    try:
        res = run_cli(checkpoint.entry_path, ["--model", str(model), *args])
    finally:
        reset_global_ctx()  # 出错时入口脚本可能没来得及清理
        reset_tp_info()
    expect_exit(case, res, **values)


def test_max_seq_len_rule_is_stated(checkpoint, tiny_models):
    """提示词 "Hello" 在小模型的分词器里是 1 个 token：1 + 5 = 6 > 5。"""
    refused(checkpoint, tiny_models["qwen3-tied"], "ch4/max_seq_len_rule", "--prompt", "Hello",
            "--max-new-tokens", "5", "--max-seq-len", "5", max_seq_len=5)


@pytest.mark.parametrize("big_page", ["100000000", "64"])
def test_page_size_beyond_the_sequence_is_refused(checkpoint, tiny_models, big_page):
    refused(checkpoint, tiny_models["qwen3-tied"], "ch4/page_size_beyond_max_seq_len", "--prompt", "Hello",
            "--max-new-tokens", "4", "--max-seq-len", "32", "--page-size", big_page, page_size=big_page,
            max_seq_len=32)


def test_empty_prompt_names_the_prompt(checkpoint, tiny_models):
    refused(checkpoint, tiny_models["qwen3-tied"], "ch4/empty_prompt", "--prompt", "Hello", "--prompt", "")


def test_missing_tokenizer_names_the_files(checkpoint, tiny_models, tmp_path):
    model = tmp_path / "no_tokenizer"
    model.mkdir()
    for f in tiny_models["qwen3-tied"].iterdir():
        if not f.name.startswith("tokenizer"):
            shutil.copy(f, model / f.name)
    refused(checkpoint, model, "ch4/missing_tokenizer", "--prompt", "Hello", dir=model)


def test_dump_logits_to_a_directory_is_refused_before_generating(checkpoint, tiny_models, tmp_path):
    refused(checkpoint, tiny_models["qwen3-tied"], "ch4/dump_logits_is_a_dir", "--prompt", "Hello",
            "--dump-logits", str(tmp_path), path=tmp_path)


def test_pool_too_small_says_so_without_a_traceback(checkpoint, tiny_models):
    refused(checkpoint, tiny_models["qwen3-tied"], "ch4/pool_too_small", "--prompt", "Hello", "--num-pages", "1")
