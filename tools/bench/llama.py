"""llama.cpp 作对照（可选）：用它自己的 convert_hf_to_gguf.py 把同一个模型转成 F32 GGUF，再用 llama-bench 量
decode（-n）和 prefill（-p）。

llama.cpp 不是课程的依赖，怎么编见附录"拿 llama.cpp 作对照"。它的转换脚本要 sentencepiece：这是可选依赖
（pyproject.toml 的 llama-cpp 一组），没装就说一行怎么装，不替你装。
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.manifest import ROOT

SENTENCEPIECE = "sentencepiece==0.2.3"  # 和 pyproject.toml 的 [project.optional-dependencies] llama-cpp 一致


def require_sentencepiece() -> None:
    if importlib.util.find_spec("sentencepiece") is None:
        raise SystemExit(f"错误：llama.cpp 的 convert_hf_to_gguf.py 要 sentencepiece（只有 llama.cpp 对照要它，"
                         f"是可选依赖）：先 .venv/bin/pip install {SENTENCEPIECE}")


def _last_line(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["（没有输出）"])[-1]


class LlamaBench:
    """构造时转换一次（GGUF 放在临时目录，对象没了就删），decode_seconds 每次跑一遍 llama-bench。"""

    def __init__(self, binary: str, convert: str | None, model: str, threads: int) -> None:
        self.binary, self.threads = binary, threads
        convert, model = str(Path(convert or self._find_convert(binary)).resolve()), str(Path(model).resolve())
        self.dir = tempfile.TemporaryDirectory(prefix="bench-gguf-")
        self.gguf = str(Path(self.dir.name) / "model-f32.gguf")
        require_sentencepiece()
        cmd = [sys.executable, convert, model, "--outtype", "f32", "--outfile", self.gguf]
        if (Path(model) / "TINY_MODEL").exists():
            # 随机权重的检查点配的是自己训的小分词器，转换脚本按分词结果的哈希认预分词规则，认不出就拒绝转换。
            # llama-bench 只量 decode、不分词，所以让它按 default 规则转（gguf_convert.py）：读的权重和算的步骤都不变
            print("llama.cpp：随机权重检查点的分词器转换脚本不认识，按 default 预分词规则转换（不影响 decode 计时）",
                  flush=True)
            cmd[1:2] = ["-m", "tools.bench.gguf_convert", convert]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)  # ROOT：找得到 tools
        if res.returncode != 0:
            raise SystemExit(f"错误：{Path(convert).name} 转换 {model} 失败：{_last_line(res.stderr)}")

    @staticmethod
    def _find_convert(binary: str) -> str:
        for d in Path(binary).resolve().parents:
            for cand in (d / "convert_hf_to_gguf.py", d / "llama.cpp" / "convert_hf_to_gguf.py"):
                if cand.is_file():
                    return str(cand)
        raise SystemExit(f"错误：在 {binary} 的上级目录里找不到 convert_hf_to_gguf.py：用 --llama-convert 指定")

    def _tokens_per_second(self, prompt: int, gen: int) -> float:
        cmd = [self.binary, "-m", self.gguf, "-p", str(prompt), "-n", str(gen), "-t", str(self.threads), "-r", "1",
               "-o", "json"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"错误：{' '.join(cmd)} 失败：{_last_line(res.stderr)}")
        return json.loads(res.stdout)[0]["avg_ts"]

    def decode_seconds(self, steps: int) -> float:
        """llama-bench -p 0 -n steps：只量生成（decode），返回每个 token 的秒数。"""
        return 1 / self._tokens_per_second(0, steps)

    def prefill_seconds(self, tokens: int) -> float:
        """llama-bench -p tokens -n 0：只量处理提示词（一个 tokens 长的序列），返回整个 prefill 的秒数。"""
        return tokens / self._tokens_per_second(tokens, 0)
