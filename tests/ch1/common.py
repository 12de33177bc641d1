"""第 1 章测试共用的小工具。按完整的点分名字导入：from tests.ch1.common import ...（理由见 tests/ch3/common.py）。"""

import importlib.util
import shutil
import subprocess

import pytest

from tests.harness.batch import make_batch as ready_batch  # noqa: F401  字段都填好的 batch，和 generate.py 的 step 建的一样
from tests.harness.errors import run_cli


def only_generate_of_ch1_ch2(checkpoint, covered_by: str):
    """这些测试调用第 1、2 章 generate.py 里的函数（make_req / generate）；第 3 章起同样的检查在 main() 里，
    由 covered_by（tests/ch3 的命令行测试的 node id）覆盖。tests/repo/test_skip_reasons.py 查它真的存在。"""
    if checkpoint.chapter > 2:
        pytest.skip(f"调用的是第 1、2 章 generate.py 的内部函数；第 3 章起由命令行测试 {covered_by} 覆盖")


def load_generate(checkpoint):
    spec = importlib.util.spec_from_file_location("generate_under_test", checkpoint.entry_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def copy_model(src, dst, files=None):
    dst.mkdir()
    for f in src.iterdir():
        if files is None or f.name in files:
            shutil.copy(f, dst / f.name)
    return dst


def cli(checkpoint, argv) -> subprocess.CompletedProcess:
    """在本进程里按 __main__ 跑入口脚本（tests/harness/errors.py 的 run_cli），省掉起进程、import torch 的几秒；
    结果和子进程一样交给 expect_exit。"""
    return run_cli(checkpoint.entry_path, argv)
