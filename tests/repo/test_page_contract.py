"""第 2、3 章页面上写的契约和测试、参考代码对得上：页面说的就是测试要的，改了一边另一边跟着失败。

- 第 2 章：参数按 torch 的默认 dtype 建；RoPE 收 (N, H, D)、返回输入的 dtype；Llama 3 的频率缩放算式
  （照页面写的算式算一遍，和参考代码逐位相同）；第 1 章留下来、本章要保住的行为。
- 第 3 章：load_weight 是生成器（检查在第一次 next() 时跑）；_open 报文件路径；引擎里的名字是带 .weight 的参数名；
  模型 state_dict 的每一个键都列在页面上；ModelConfig 没有 max_position_embeddings，main() 读 rotary_config。

只读源文件（ast）或在子进程里 import 检查点，不在本进程里 import 任何一个 minisgl。
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _task(chapter: int, number: int) -> str:
    text = (DOCS / f"ch{chapter}.md").read_text(encoding="utf-8")
    return re.search(rf"^### 任务 {number} · .*?(?=^### 任务 |^## |\Z)", text, re.M | re.S).group(0)


def _flat(text: str) -> str:
    """页面的换行只是排版：拼成一行再找句子。"""
    return re.sub(r"\n\s*", "", text)


def _tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text(encoding="utf-8"))


def _function(rel: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(_tree(rel)) if isinstance(n, ast.FunctionDef) and n.name == name)


# ---------------------------------------------------------------- 第 2 章


def test_ch2_parameters_follow_the_default_dtype():
    """bf16 的 RMSNorm 测试在 set_default_dtype(bfloat16) 下建算子：参数的 torch.empty 不许写死 dtype，页面要说。"""
    tests = (ROOT / "tests/ch2/test_layers.py").read_text(encoding="utf-8")
    assert "torch.set_default_dtype(dtype)" in tests, "测试不再按默认 dtype 建算子：改第 2 章任务 2 的'参数的 dtype'"
    for f in sorted((ROOT / "ch2_ops/minisgl/layers").glob("*.py")):
        for call in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "torch.empty":
                assert not any(k.arg == "dtype" for k in call.keywords), f"{f.name}: {ast.unparse(call)}"
    page = _flat(_task(2, 2))
    assert "默认 dtype" in page and "torch.set_default_dtype(torch.bfloat16)" in page, "任务 2 要说参数按默认 dtype 建"


def test_ch2_page_gives_rope_its_head_shaped_input_and_dtype():
    """test_task2_rope_keeps_dtype_and_accepts_heads_dim 传 (N, H, D) 和 bf16：页面的形状表和要点都要写。"""
    assert "def test_task2_rope_keeps_dtype_and_accepts_heads_dim" in \
        (ROOT / "tests/ch2/test_layers.py").read_text(encoding="utf-8")
    row = next(ln for ln in _task(2, 2).splitlines() if ln.startswith("| `RotaryEmbedding("))
    assert "`(N, H_q, D)`" in row and "`(N, H_kv, D)`" in row and "同 dtype" in row, row
    assert "转回输入的 dtype" in _flat(_task(2, 2))


# 页面上 Llama 3 缩放的三句算式（改页面时同步改这里和下面照着它写的算法）
LLAMA3_ON_PAGE = ["`λ > L / low`（长波、低频）的取`f / factor`", "`λ < L / high`（短波、高频）的 `f` 不动",
                  "`(1 - s) · f / factor + s · f`，其中 `s = (L / λ - low) / (high - low)`"]


def _llama3_as_the_page_says(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    L, low, high, factor = (scaling["original_max_position_embeddings"], scaling["low_freq_factor"],
                            scaling["high_freq_factor"], scaling["factor"])
    out = []
    for f in inv_freq.tolist():
        lam = 2 * math.pi / f
        if lam > L / low:
            out.append(f / factor)
        elif lam < L / high:
            out.append(f)
        else:
            s = (L / lam - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def test_ch2_page_llama3_formula_is_the_code():
    """页面写出 Llama 3 的平滑算式；照页面算出的频率和 ch2 的 _llama3_inv_freq 相同，三段都取到。"""
    page = _flat(_task(2, 2))
    for sentence in LLAMA3_ON_PAGE:
        assert _flat(sentence) in page, sentence
    fn = _function("ch2_ops/minisgl/layers/rotary.py", "_llama3_inv_freq")
    scope = {"torch": torch, "math": math, "Dict": dict, "Any": object}
    exec(compile(ast.Module([fn], []), "rotary.py", "exec"), scope)
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    lam = 2 * math.pi / inv
    L = scaling["original_max_position_embeddings"]
    assert (lam > L).any() and (lam < L / 4).any() and ((lam >= L / 4) & (lam <= L)).any(), "三段都要取到"
    torch.testing.assert_close(scope["_llama3_inv_freq"](inv, scaling), _llama3_as_the_page_says(inv, scaling),
                               rtol=1e-12, atol=0)


def test_ch2_page_names_what_chapter1_left_behind():
    """第 1 章的测试在第 2 章照跑：假模型只有 cfg（哪几个键）、整数权重、空提示词，页面任务 5 都要点名。"""
    src = (ROOT / "tests/ch1/test_generate_input.py").read_text(encoding="utf-8")
    keys = re.findall(r'"(\w+)":', re.search(r"SimpleNamespace\(cfg=(\{[^}]*\})", src).group(1))
    page = _flat(_task(2, 5))
    assert "`self.cfg`" in page
    for key in keys:
        assert f'`model.cfg["{key}"]`' in page, key
    cases = {c["id"] for c in tomllib.loads((ROOT / "tests/ch1/errors.toml").read_text(encoding="utf-8"))["case"]}
    for case in ("integer_weights", "empty_prompt"):
        assert case in cases and f"`{case}`" in page, case


# ---------------------------------------------------------------- 第 3 章


def test_ch3_load_weight_is_a_generator_and_the_page_says_when_it_checks():
    """test_task6_missing_shard 在报错检查外调用 load_weight、在里面 next()：它必须是生成器函数，页面要说检查何时跑。"""
    fn = _function("ch3_model_loading/minisgl/models/weight.py", "load_weight")
    assert any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn)), "load_weight 不再是生成器：改任务 6"
    test = _function("tests/ch3/test_loading.py", "test_task6_missing_shard")
    assert "next(weights)" in ast.unparse(test.body[-1]), "测试不再在报错检查里 next()：改任务 6 的那一段"
    page = _flat(_task(3, 6))
    assert "普通的生成器函数" in page and "第一次 `next()`" in page


def test_ch3_open_reports_the_path_the_table_asks_for():
    """截断的文件报的是传给 _open 的完整路径（报错表的 {file}），正文不能说"文件名"。"""
    errors = tomllib.loads((ROOT / "tests/ch3/errors.toml").read_text(encoding="utf-8"))
    case = next(c for c in errors["case"] if c["id"] == "corrupt_safetensors")
    assert case["message"] == ["{file}"] and errors["echo"]["file"] == "文件路径"
    sentence = next(s for s in _flat(_task(3, 4)).split("；") if "`_open(file, device)`" in s)
    assert "文件路径" in sentence and "文件名" not in sentence, sentence


def test_ch3_engine_names_are_parameter_names():
    """引擎里的名字是 state_dict 的键（带 .weight）：页面 _rename 的例子照代码算一遍，报错表的例子也带 .weight。"""
    weight = _tree("ch3_model_loading/minisgl/models/weight.py")
    fns = [n for n in weight.body if isinstance(n, ast.FunctionDef) and n.name in ("_rename", "_num_parts")]
    scope: dict = {"Dict": dict, "Tuple": tuple}
    exec(compile(ast.Module(fns, []), "weight.py", "exec"), scope)
    decoder = _tree("ch3_model_loading/minisgl/models/decoder.py")
    packed = next(ast.literal_eval(n.value) for n in ast.walk(decoder) if isinstance(n, ast.Assign)
                  and ast.unparse(n.targets[0]) == "packed_modules_mapping")
    got = scope["_rename"]("model.layers.0.self_attn.k_proj.weight", packed)
    page = _flat(_task(3, 4))
    assert f'`("{got[0]}", {got[1]}, {got[2]})`' in page, got
    echo = tomllib.loads((ROOT / "tests/ch3/errors.toml").read_text(encoding="utf-8"))["echo"]
    assert "qkv_proj.weight" in echo["engine"] and "qkv_proj.weight" in echo["merged"], echo


KEYS = r"""
import json, sys, torch
from minisgl.distributed import set_tp_info
from minisgl.models import ModelConfig, create_model, load_hf_config
set_tp_info(0, 1)
keys = set()
for path in sys.argv[1:]:
    with torch.device("meta"):
        keys |= set(create_model(ModelConfig.from_hf(load_hf_config(path))).state_dict())
print(json.dumps(sorted(keys)))
"""


def test_ch3_page_lists_every_state_dict_key(tiny_models):
    """任务 2 列出的键（层号写成 {i}）正好是四个家族的参考模型 state_dict 的键：属性名不用从第 2 章的代码里猜。"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "ch3_model_loading"), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", KEYS, *map(str, tiny_models.values())], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    keys = {re.sub(r"\.layers\.\d+\.", ".layers.{i}.", k) for k in json.loads(res.stdout)}
    block = re.search(r"```text\n(model\.embed_tokens\.weight\n.*?)```", _task(3, 2), re.S).group(1)
    assert set(block.split()) == keys, sorted(set(block.split()) ^ keys)
    assert "`o_proj`、`gate_up_proj`、`down_proj` 在三个家族里都不带 bias" in _flat(_task(3, 2))


def test_ch3_main_reads_max_position_from_rotary_config():
    """ModelConfig 没有 max_position_embeddings 字段：main() 读 rotary_config.max_position，页面要这么说。"""
    cls = next(n for n in ast.walk(_tree("ch3_model_loading/minisgl/models/config.py"))
               if isinstance(n, ast.ClassDef) and n.name == "ModelConfig")
    fields = {ast.unparse(n.target) for n in cls.body if isinstance(n, ast.AnnAssign)}
    assert "rotary_config" in fields and "max_position_embeddings" not in fields, fields
    assert "config.rotary_config.max_position" in ast.unparse(_function("ch3_model_loading/generate.py", "main"))
    assert "`config.rotary_config.max_position`" in _flat(_task(3, 3))
