"""命令行契约本身：--json 的那一次真的起一个子进程，像读者那样运行入口脚本；其余的在本进程里按 __main__ 跑
（tests/harness/errors.py 的 run_cli：stdout、stderr、退出码和子进程一样），省掉每次起进程、import torch 的几秒。"""

import json

from tests.harness.contract import run_subprocess
from tests.harness.errors import expect_exit, run_cli


def test_json_last_line(checkpoint, tiny_models):
    model = tiny_models[checkpoint.families[0]]
    res = run_subprocess(checkpoint.entry_path, ["--model", str(model), "--prompt", "Hello", "--prompt", "你好",
                                                  "--max-new-tokens", "16", "--json"])
    assert res.returncode == 0, res.stderr
    outputs = json.loads(res.stdout.strip().splitlines()[-1])["outputs"]
    assert [len(o) for o in outputs] == [16, 16]


def test_readable_output(checkpoint, tiny_models):
    model = tiny_models[checkpoint.families[0]]
    res = run_cli(checkpoint.entry_path, ["--model", str(model), "--prompt", "Hello", "--max-new-tokens", "4"])
    assert res.returncode == 0, res.stderr
    assert "tokens/s" in res.stdout
    assert "'Hello'" in res.stdout


def test_unsupported_page_size_is_refused(checkpoint, tiny_models):
    model = tiny_models[checkpoint.families[0]]
    bad = 3 if 1 in checkpoint.page_sizes and len(checkpoint.page_sizes) > 1 else 4
    res = run_cli(checkpoint.entry_path, ["--model", str(model), "--prompt", "Hello", "--page-size", str(bad)])
    if len(checkpoint.page_sizes) == 1:
        expect_exit("checkpoint/unsupported_page_size", res)
    else:
        assert res.returncode == 0, res.stderr  # 有分页 KV 的检查点任何正的页大小都应能跑


def test_missing_model_dir_names_the_path(checkpoint, tmp_path):
    res = run_cli(checkpoint.entry_path, ["--model", str(tmp_path / "nope"), "--prompt", "Hello"])
    expect_exit("checkpoint/missing_model_dir", res, path=tmp_path / "nope")
