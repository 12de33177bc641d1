"""页面上"本章用到的 torch.cuda / torch.distributed 接口"表：从参考检查点里读者要写的文件现读出来（AST），不手抄。

    <!-- torch 接口 -->      # 第 6 章页面上的占位符，构建时换成 table(检查点)

收的是函数体里对 torch.cuda.*、torch.distributed.*（含 import torch.distributed as dist）的调用和引用，
以及这些调用建出的对象上的方法：event = torch.cuda.Event(); event.record() 记成 torch.cuda.Event.record；
self.graph_map: Dict[int, torch.cuda.CUDAGraph] 里取出来的 .replay() 记成 torch.cuda.CUDAGraph.replay。
类型注解不算（那不是调用）。每个接口在 WHAT 里要有一句"做什么"：代码用了新接口而这里没写，构建失败、测试报出来。
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from tools.manifest import Checkpoint, is_given
from tools.workbench.stubs import changes, functions

MARK = "<!-- torch 接口 -->"  # 页面上的占位符
ROOTS = ("torch.cuda.", "torch.distributed.")

# 每个接口做什么（一句）；键是全名，方法写成 类.方法
WHAT = {
    "torch.cuda.is_available": "这台机器有没有能用的 GPU（`device=\"auto\"` 靠它选设备）",
    "torch.cuda.set_device": "把这个进程的当前卡设成这个 rank 的卡（`cuda:{rank}`）",
    "torch.cuda.mem_get_info": "返回 `(空闲, 总量)` 字节；`available_memory` 取第 0 个",
    "torch.cuda.Event": "建一个 CUDA 事件",
    "torch.cuda.Event.record": "在当前流上记下\"到这里为止的工作\"（含刚发出的异步拷贝）；"
                               "之后 `synchronize()` 等到它们做完",
    "torch.cuda.CUDAGraph": "一张空的 CUDA 图",
    "torch.cuda.graph": "`with` 里发出的设备操作录进图（真 GPU 上录的时候不执行）；`pool=` 给了就和那张图共用显存池",
    "torch.cuda.CUDAGraph.pool": "这张图的显存池句柄，传给下一张图的 `pool=`",
    "torch.cuda.CUDAGraph.replay": "把录好的整段 kernel 一次提交（读写的还是录图时那几块内存）",
    "torch.distributed.init_process_group": "各 rank 在 `init_method` 的地址会合，建默认进程组；"
                                            "`timeout` 也管之后的每次集合通信",
    "torch.distributed.new_group": "在同一批 rank 上另建一个组；`backend=\"gloo\"` 是 CPU 上的组",
    "torch.distributed.group.WORLD": "默认进程组本身（CPU 上整组用 gloo 时直接拿它当 CPU 组）",
    "torch.distributed.is_initialized": "默认进程组建了没有",
    "torch.distributed.destroy_process_group": "拆掉默认进程组和从它建的组，释放会合用的端口",
}


@dataclass
class Use:
    api: str  # 全名，如 torch.distributed.new_group、torch.cuda.Event.record
    shapes: list[str] = field(default_factory=list)  # 参考实现里的调用写法（参数只留名字和常量）
    where: dict[str, list[str]] = field(default_factory=dict)  # 文件 -> 函数


def _aliases(tree: ast.Module) -> dict[str, str]:
    """import torch / import torch.distributed as dist：名字 -> 全名。"""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def _tracked(name: str | None) -> bool:
    return bool(name) and name.startswith(ROOTS)


def _arg(node: ast.AST) -> str:
    """位置参数：常量原样，名字、self.x 照写，别的写成 …"""
    if isinstance(node, ast.Constant):
        return repr(node.value).replace("'", '"')
    if isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        return ast.unparse(node)
    return "…"


def _is_method(api: str) -> bool:
    """torch.cuda.Event.record 这种：倒数第二段是类名。"""
    return api.rsplit(".", 2)[-2][:1].isupper()


def _shape(api: str, call: ast.Call | None) -> str:
    """参考实现里的写法：关键字参数只留名字（常量除外），方法写出它是在谁身上调的。"""
    if call is None:
        return api
    name = api
    if _is_method(api) and isinstance(call.func, ast.Attribute):
        owner = call.func.value
        owner_text = f"{ast.unparse(owner.value)}[…]" if isinstance(owner, ast.Subscript) else ast.unparse(owner)
        name = f"{owner_text}.{call.func.attr}"
    args = [_arg(a) for a in call.args]
    args += [f"{k.arg}={_arg(k.value) if isinstance(k.value, ast.Constant) else '…'}" for k in call.keywords]
    return f"{name}({', '.join(args)})"


def _attr_types(cls: ast.ClassDef, aliases: dict[str, str]) -> dict[str, tuple[str, bool]]:
    """self.x: T 的注解：x -> (T 里的 torch 类型, T 是不是容器)。容器取下标才是那个类型。"""
    out = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute):
            text = ast.unparse(node.annotation)
            for alias, full in aliases.items():
                text = re.sub(rf"\b{alias}\.", f"{full}.", text)
            hit = re.search(r"(torch\.(?:cuda|distributed)\.\w+)", text)
            if hit:
                out[node.target.attr] = (hit[1], isinstance(node.annotation, ast.Subscript))
    return out


class _Collector(ast.NodeVisitor):
    def __init__(self, aliases: dict[str, str], attrs: dict[str, tuple[str, bool]]) -> None:
        self.aliases, self.attrs = aliases, attrs
        self.local: dict[str, str] = {}  # 局部变量 -> 建它的 torch 类型
        self.hits: list[tuple[str, ast.Call | None]] = []

    def _type_of(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.local.get(node.id)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            kind = self.attrs.get(node.value.attr)
            return kind[0] if kind and kind[1] else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            kind = self.attrs.get(node.attr)
            return kind[0] if kind and not kind[1] else None
        return None

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # 注解不是调用
        if node.value is not None:
            self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        if isinstance(node.value, ast.Call) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            api = _dotted(node.value.func, self.aliases)
            if _tracked(api):
                self.local[node.targets[0].id] = api

    def visit_Call(self, node: ast.Call) -> None:
        api = _dotted(node.func, self.aliases)
        if not _tracked(api) and isinstance(node.func, ast.Attribute):
            owner = self._type_of(node.func.value)
            api = f"{owner}.{node.func.attr}" if owner else None
            if api is None:
                self.visit(node.func)
        if api:
            self.hits.append((api, node))
        for a in [*node.args, *(k.value for k in node.keywords)]:
            self.visit(a)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        api = _dotted(node, self.aliases)
        if _tracked(api):
            self.hits.append((api, None))
        else:
            self.generic_visit(node)


def uses(ck: Checkpoint) -> list[Use]:
    """读者要写的文件（本章的 changes 去掉给定的）里用到的接口，按第一次出现的顺序。"""
    found: dict[str, Use] = {}
    for rel in changes(ck):
        if not rel.endswith(".py") or is_given(ck.chapter, rel) or not (ck.path / rel).is_file():
            continue
        tree = ast.parse((ck.path / rel).read_text(encoding="utf-8"))
        aliases = _aliases(tree)
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        for qual, fn in functions(tree):
            owner = classes.get(qual.split(".")[0]) if "." in qual else None
            c = _Collector(aliases, _attr_types(owner, aliases) if owner else {})
            for stmt in fn.body:
                c.visit(stmt)
            for api, call in c.hits:
                use = found.setdefault(api, Use(api))
                shape, quals = _shape(api, call), use.where.setdefault(rel, [])
                use.shapes += [shape] if shape not in use.shapes else []
                quals += [qual] if qual not in quals else []
    return list(found.values())


def table(ck: Checkpoint) -> str:
    """Markdown 表；有接口没写"做什么"就报错（构建失败），免得页面漏掉代码新用的接口。"""
    rows = ["| 接口 | 参考实现里的写法 | 用在 | 做什么 |", "|---|---|---|---|"]
    all_uses = uses(ck)
    if missing := [u.api for u in all_uses if u.api not in WHAT]:
        raise KeyError(f"tools/book/torch_apis.py 的 WHAT 里没有这些接口的说明：{missing}")
    for u in all_uses:
        head, _, method = u.api.rpartition(".")
        name = f"`{head}` 的 `.{method}()`" if _is_method(u.api) else f"`{u.api}`"
        where = "；".join(f"`{rel}`：" + "、".join(f"`{q}`" for q in quals) for rel, quals in u.where.items())
        rows.append(f"| {name} | {'、'.join(f'`{s}`' for s in u.shapes)} | {where} | {WHAT[u.api]} |")
    return "\n".join(rows)
