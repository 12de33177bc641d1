"""流式加载权重：一个张量一个张量地从 safetensors 读出来，当场切出本 rank 的那份、合并成引擎的布局，交出去。

内存里任何时候只有"已经交出去的" + pending 里还没凑齐的合并组（q/k/v、gate/up）。分片的检查点里，
同一组的几块可能在不同的文件里，pending 里会同时有几组；它们都是切好的、自己的内存，和交出去的不重叠，
峰值接近一份权重而不是两份。
切法由各个算子自己定（BaseOP.shard）；这里只负责改名、合并和按文件顺序读。只读 safetensors，绝不 unpickle。
"""

from __future__ import annotations

import glob
import json
import os
import stat
from typing import Dict, Iterator, Tuple

import torch
from safetensors import SafetensorError, safe_open

from minisgl.layers import BaseOP, OPList

from .base import BaseLLMModel

_SKIPPED = (".rotary_emb.inv_freq",)  # 老检查点里存的 RoPE 频率：可以算出来，不是权重
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # 量化的（int8、fp8…）阶段一不支持


def _is_regular_file(path: str) -> bool:
    """不存在 -> False；目录、FIFO、设备 -> 报错：打开 FIFO 会一直等写端，目录的报错又说不到点上。"""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} 不是普通文件（目录、FIFO 或设备？）：权重和分片索引只从普通文件读")
    return True


def safetensors_files(model_path: str) -> list[str]:
    """和 HF 一样：有 model.safetensors 就只读它，否则只读 model.safetensors.index.json 列出的分片。
    目录里别的 *.safetensors 一概不读：多出来的文件里的同名张量会悄悄盖掉真的。"""
    single = os.path.join(model_path, "model.safetensors")
    if _is_regular_file(single):
        return [single]
    index = os.path.join(model_path, "model.safetensors.index.json")
    if _is_regular_file(index):
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, AttributeError, TypeError) as e:  # JSON 坏了，或者没有 weight_map
            raise ValueError(f"{index} 不是有效的分片索引（要有 weight_map）：{e!r}") from None
        missing = [n for n in names if not _is_regular_file(os.path.join(model_path, n))]
        if missing:
            raise FileNotFoundError(f"{index} 列出的分片不存在：{missing}")
        return [os.path.join(model_path, n) for n in names]
    others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_path, "*.safetensors")))
    pickles = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_path, "*"))
                     if p.endswith((".bin", ".pt", ".pth")))
    if pickles and not others:
        raise ValueError(f"{model_path} 只有 {pickles}：这是 pickle 格式，加载它等于执行任意代码，"
                         f"这里只读 safetensors。请下载或转换成 .safetensors")
    hint = f"；{others} 不会被读（和 HF 一样，没有索引时只认 model.safetensors）" if others else ""
    raise FileNotFoundError(f"{model_path} 里没有 model.safetensors，也没有 model.safetensors.index.json{hint}")


def _open(file: str, device: torch.device | str):
    """截断或损坏的文件在读文件头时就会出错：报出是哪个文件，而不是一句不带文件名的 SafetensorError。"""
    try:
        return safe_open(file, framework="pt", device=str(device))
    except SafetensorError as e:
        raise ValueError(f"{file} 不是完整的 safetensors 文件（截断了或者损坏了？重新下载它）：{e}") from None


def _get_tensor(file: str, key: str, device: torch.device | str) -> torch.Tensor:
    """每个张量单独打开一次文件。safetensors 把文件 mmap 进来，读过的页算进进程的常驻内存，文件一直开着的话，
    读到最后会多出整整一份权重；单独打开，这个张量的视图一释放（复制完就释放）映射就解除、页也不再算进来。"""
    with _open(file, device) as f:
        return f.get_tensor(key)


def find_op(root: BaseOP, name: str) -> BaseOP:
    """'model.layers.3.mlp.down_proj' -> 对应的算子对象。"""
    op = root
    for part in name.split("."):
        if isinstance(op, OPList):
            op = op.op_list[int(part)] if part.isdigit() and int(part) < len(op.op_list) else None
        else:
            op = getattr(op, part, None)
        if not isinstance(op, BaseOP):
            raise KeyError(f"检查点里的 {name} 在模型里没有对应的算子")
    return op


def _rename(key: str, packed: Dict[str, Tuple[str, int]]) -> Tuple[str, int, int]:
    """HF 的名字 -> (引擎里合并后的名字, 第几块, 一共几块)；不合并的原样，算一块。"""
    for old, (new, part) in packed.items():
        if f".{old}." in key:
            return key.replace(f".{old}.", f".{new}."), part, _num_parts(new, packed)
    return key, 0, 1


def _num_parts(new: str, packed: Dict[str, Tuple[str, int]]) -> int:
    """合并成 new 的有几块（qkv_proj 3 块，gate_up_proj 2 块）。"""
    return sum(n == new for n, _ in packed.values())


def _hf_names(name: str, packed: Dict[str, Tuple[str, int]]) -> list[str]:
    """引擎里的一个名字在检查点里对应的全部名字：合并的是每一块，不合并的是它自己。"""
    for new, _ in packed.values():
        if f".{new}." in name:
            return [_hf_name(name, p, packed) for p in range(_num_parts(new, packed))]
    return [name]


def _hf_name(name: str, part: int, packed: Dict[str, Tuple[str, int]]) -> str | None:
    """合并后的名字 + 第几块 -> 检查点里原来的名字（_rename 的反方向）。"""
    for old, (new, p) in packed.items():
        if f".{new}." in name and p == part:
            return name.replace(f".{new}.", f".{old}.")
    return None


def load_weight(model_path: str, model: BaseLLMModel, device: torch.device | str = "cpu"
                ) -> Iterator[Tuple[str, torch.Tensor]]:
    """逐个交出 (引擎里的名字, 本 rank 的张量)。dtype 不在这里转：调用方边收边转，省得多留一份。

    读完所有文件，模型还有参数没拿到（比如 config.json 的 num_hidden_layers 比权重的层数多）：ValueError 写出文件和
    检查点里缺的名字（model.layers.3.self_attn.q_proj.weight，不是合并后的 qkv_proj），不等 load_state_dict 报错。"""
    packed = model.packed_modules_mapping
    pending: Dict[str, Dict[int, torch.Tensor]] = {}
    seen: Dict[str, str] = {}  # 键 -> 它所在的文件
    produced: set[str] = set()  # 交出去的引擎里的名字
    files = safetensors_files(model_path)
    for file in files:
        with _open(file, device) as f:
            for key in f.keys():
                if key in seen:  # 分片之间重复：哪份算数说不清，HF 也不会替你挑
                    raise ValueError(f"{key} 同时出现在 {os.path.basename(seen[key])} 和 "
                                     f"{os.path.basename(file)} 里（{model_path}）")
                seen[key] = file
                if key.endswith(_SKIPPED):
                    continue
                name, part, total = _rename(key, packed)
                try:
                    op = find_op(model, name.rsplit(".", 1)[0])
                except KeyError:  # 比如检查点的层数比 config.json 的 num_hidden_layers 多
                    raise ValueError(f"{file} 里的 {key} 在模型里没有对应的算子") from None
                full = _get_tensor(file, key, device)
                if full.dtype not in _FLOAT_DTYPES:  # 引擎会 .to(dtype)：整数或 fp8 会被悄悄转成错的权重
                    raise ValueError(f"{os.path.basename(file)} 里的 {key} 是 {full.dtype}，"
                                     f"权重只能是 float32/bfloat16/float16（量化的检查点阶段一不支持）")
                try:  # 切分时发现完整形状和 config.json 对不上（比如 vocab_size 比词嵌入小）：补上文件和张量名
                    local = op.shard(full, part)
                except ValueError as e:
                    raise ValueError(f"{file} 里的 {key}（引擎里的 {name}）：{e}") from None
                if total == 1:  # safetensors 给的是指向映射文件的视图：复制一份，引擎的权重才是自己的、对齐的内存
                    produced.add(name)
                    yield name, local.clone()
                    continue
                if local.untyped_storage().nbytes() > local.nbytes:
                    local = local.clone()  # 切片还拽着整块原张量：复制出自己那份，原张量才能释放
                group = pending.setdefault(name, {})
                group[part] = local
                if len(group) == total:  # 凑齐了：按 q,k,v / gate,up 的顺序拼成一块
                    parts = [group[i] for i in range(total)]
                    if len({p.shape[1:] for p in parts}) > 1:  # 否则是一句不带名字的 torch.cat 报错
                        raise ValueError(f"{model_path}: 合并成 {name} 的几块形状对不上：" + "，".join(
                            f"{_hf_name(name, i, packed)} {tuple(p.shape)}" for i, p in enumerate(parts)))
                    produced.add(name)
                    yield name, torch.cat(parts)
                    del pending[name]
    if pending:
        missing = [hf for name, group in pending.items() for part, hf in enumerate(_hf_names(name, packed))
                   if part not in group]
        raise ValueError(f"{model_path}: 检查点缺少 {missing}，凑不齐合并的权重 {sorted(pending)}")
    never = [n for key in model.state_dict() if key not in produced for n in _hf_names(key, packed)]
    if never:  # 否则是 load_state_dict 一句不带文件名、说的还是合并后名字的 KeyError
        names = ", ".join(os.path.basename(f) for f in files)
        raise ValueError(f"{model_path} 的 {names} 里没有 {never[:3]}{' 等' if len(never) > 3 else ''}"
                         f"（共 {len(never)} 个）：config.json 和权重文件对不上（比如 num_hidden_layers 比权重的层数多）")
