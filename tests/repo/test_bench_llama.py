"""tools/bench/llama.py 的 llama.cpp 对照：转换脚本失败时说一行；随机权重的检查点按 default 预分词规则转换
（经由 tools/bench/gguf_convert.py）；没装 sentencepiece 时说一行怎么装，不替你装。

真的 llama.cpp 不在 CI 上：这里用一个假的 convert_hf_to_gguf.py，它和真的一样按分词器认预分词规则，认不出就抛
NotImplementedError。新版把模型类放在 conversion/ 包里，老版在脚本自己里面：两种都要能转。
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.bench import llama as bench

TEXT_MODEL = '''
class TextModel:
    def get_vocab_base_pre(self, tokenizer):
        raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")
'''

MAIN = '''
import argparse
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--outtype")
    ap.add_argument("--outfile")
    args = ap.parse_args()
    pre = TextModel().get_vocab_base_pre(tokenizer=None)
    open(args.outfile, "w").write(f"{pre} {args.outtype} {args.model}")


if __name__ == "__main__":
    main()
'''


def _converter(tmp_path: Path, split: bool) -> Path:
    d = tmp_path / ("split" if split else "single")
    d.mkdir()
    if split:  # 新版：模型类在 conversion/base.py
        (d / "conversion").mkdir()
        (d / "conversion" / "__init__.py").write_text("")
        (d / "conversion" / "base.py").write_text(textwrap.dedent(TEXT_MODEL))
        script = "from conversion.base import TextModel\n" + MAIN
    else:
        script = TEXT_MODEL + MAIN
    (d / "convert_hf_to_gguf.py").write_text(script)
    return d / "convert_hf_to_gguf.py"


def _model(tmp_path: Path, random_weights: bool) -> Path:
    m = tmp_path / ("random" if random_weights else "trained")
    m.mkdir()
    if random_weights:
        (m / "TINY_MODEL").write_text("random weights\n")
    return m


@pytest.fixture
def sentencepiece_present(monkeypatch):
    """假的转换脚本不 import sentencepiece：当它装着。"""
    monkeypatch.setattr(bench, "require_sentencepiece", lambda: None)


@pytest.mark.parametrize("split", [True, False], ids=["conversion-package", "single-file"])
def test_random_checkpoint_converts_with_the_default_pre_tokenizer(tmp_path, capsys, sentencepiece_present,
                                                                    split):
    lb = bench.LlamaBench("/bin/true", str(_converter(tmp_path, split)), str(_model(tmp_path, True)), 1)
    assert Path(lb.gguf).read_text().split()[:2] == ["default", "f32"]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "default" in out[0] and "不影响 decode 计时" in out[0], out


def test_a_refused_tokenizer_on_a_trained_checkpoint_is_one_line(tmp_path, sentencepiece_present):
    """真模型的分词器认不出，说明这份 llama.cpp 不认识这个模型：不替它改规则，说一行，不是转换脚本的 traceback。"""
    model = _model(tmp_path, False)
    with pytest.raises(SystemExit) as e:
        bench.LlamaBench("/bin/true", str(_converter(tmp_path, True)), str(model), 1)
    msg = str(e.value)
    assert msg.startswith("错误：convert_hf_to_gguf.py 转换") and str(model) in msg
    assert "BPE pre-tokenizer was not recognized" in msg and "\n" not in msg and "Traceback" not in msg


def test_missing_sentencepiece_is_one_line_and_nothing_is_installed(tmp_path, monkeypatch):
    """sentencepiece 是可选依赖：没装时说一行怎么装（pyproject.toml 里钉的版本），不跑 pip。"""
    import importlib.util
    import subprocess

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"不该起子进程：{a}"))
    with pytest.raises(SystemExit) as e:
        bench.LlamaBench("/bin/true", str(_converter(tmp_path, True)), str(_model(tmp_path, True)), 1)
    msg = str(e.value)
    assert msg.startswith("错误：") and f"pip install {bench.SENTENCEPIECE}" in msg and "\n" not in msg
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"{bench.SENTENCEPIECE}"' in pyproject, "可选依赖要在 pyproject.toml 里声明，版本和这里一致"
