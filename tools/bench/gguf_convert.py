"""llama.cpp 的 convert_hf_to_gguf.py，只是预分词规则一律按 default（tools/bench/llama.py 给随机权重的检查点用）。

    python -m tools.bench.gguf_convert CONVERT_HF_TO_GGUF.py MODEL --outtype f32 --outfile OUT.gguf

转换脚本按分词器对一段固定文本的分词结果的哈希认预分词规则，随机权重检查点自己训的小分词器它认不出，就拒绝转换。
规则只影响分词，llama-bench 只量 decode、不分词：读的权重和算的步骤都不变。
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    script = Path(argv[0]).resolve()
    sys.argv = [str(script), *argv[1:]]  # 转换脚本自己解析命令行
    sys.path.insert(0, str(script.parent))
    convert = importlib.import_module(script.stem)
    try:
        from conversion.base import TextModel  # 新版把模型类拆进了 conversion/
    except ImportError:
        TextModel = convert.TextModel
    TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    convert.main()


if __name__ == "__main__":
    main(sys.argv[1:])
