"""自己动手的起点：从参考检查点现生成"桩"（AST 变换，不手写，所以和参考代码不会不一致）。

python course.py start ch4 复制上一章的检查点（目录的事在 tools/workbench/workspace.py），再把本章新增、修改的文件
（checkpoints.toml 的 changes）写成桩：
签名、类型注解、docstring（含形状约定）、模块级的 import 和常量、类的字段都原样保留，函数体换成
raise NotImplementedError("第 4 章 · 任务 K：名字")。哪些函数体保留：

- 只有 ... / pass / raise NotImplementedError 的（抽象方法、协议、基类的默认实现）：它们本来就没有实现；
- 只把参数存成属性的 __init__：脚手架，不是本章要学的；
- 函数体和上一章同一文件里的同名函数一模一样（只改了签名也算）：上一章已经写过；
- tests/tasks.toml 的 keep（命令行解析）：测试要靠它驱动，和本章的想法无关。

tests/tasks.toml 里一章的 given 是给定的文件（比如第 6 章的 CPU 矩阵乘核、起进程的启动器）：基础设施而不是本章
要学的，整份复制，一个桩也没有；页面的"任务"一节写明它们做什么、书里哪里讲。

私有的小函数也做成桩：保留它就等于送了一半答案，删掉又会让调用它的桩失去提示；名字本身就是建议的拆法。
"""

from __future__ import annotations

import ast
import fnmatch
import html
from dataclasses import dataclass

from tools.manifest import Checkpoint, Task, checkpoint_files, is_given, keep_symbols, load_manifest, load_tasks, match


@dataclass(frozen=True)
class Stub:
    file: str  # 检查点里的相对路径
    qualname: str  # Class.method 或 function
    node: ast.FunctionDef | ast.AsyncFunctionDef
    task: Task | None  # None：tasks.toml 里没人管它（测试会报）
    changed: bool  # 上一章有同名函数、但函数体变了

    @property
    def key(self) -> str:
        return f"{self.file}:{self.qualname}"


def previous(ck: Checkpoint) -> Checkpoint | None:
    names = [c.name for c in load_manifest()]
    i = names.index(ck.name)
    return load_manifest()[i - 1] if i > 0 else None


def changes(ck: Checkpoint) -> list[str]:
    """本章要写的文件：清单里的 changes；第 0 步没有上一章，它的全部文件都是。"""
    return ck.changes if previous(ck) else sorted(checkpoint_files(ck.path))


def functions(tree: ast.AST, prefix: str = ""):
    """模块和类里的函数（不进函数体：嵌套函数跟着外层函数一起变成桩）。"""
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")


def body(node) -> list[ast.stmt]:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _is_abstract(s: ast.stmt) -> bool:
    """raise NotImplementedError(...)：基类的默认实现本来就是"子类来写"，不是本章要写的。"""
    exc = s.exc if isinstance(s, ast.Raise) else None
    target = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(target, ast.Name) and target.id == "NotImplementedError"


def _is_empty(node) -> bool:
    return all(isinstance(s, ast.Pass) or _is_abstract(s) or (isinstance(s, ast.Expr) and isinstance(
        s.value, ast.Constant) and s.value.value is Ellipsis) for s in body(node))


def _only_stores(node) -> bool:
    """__init__ 只有 self.x = 参数 / 常量 这种赋值。"""
    if node.name != "__init__":
        return False
    for s in body(node):
        targets = s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, ast.AnnAssign) else None
        if targets is None or not all(isinstance(t, ast.Attribute) for t in targets):
            return False
        if not isinstance(s.value, (ast.Name, ast.Constant)):
            return False
    return True


def _dump(node) -> str:
    return "\n".join(ast.dump(s) for s in body(node))


def find_stubs(ck: Checkpoint) -> list[Stub]:
    """这一章要读者自己写的函数，按文件、行号排序。"""
    prev = previous(ck)
    old_files = checkpoint_files(prev.path) if prev else {}
    old: dict[str, set[str]] = {}  # 上一章任何文件里的同名函数（文件可能搬了家：skeleton.py -> model.py）
    same_file: set[str] = set()  # 上一章同一个文件里的 "文件:符号"：桩里提示"改写旧版本"
    for f, data in old_files.items():
        if f.endswith(".py"):
            for q, n in functions(ast.parse(data.decode())):
                old.setdefault(q, set()).add(_dump(n))
                same_file.add(f"{f}:{q}")
    tasks = load_tasks().get(ck.chapter, [])
    keep = keep_symbols()
    out = []
    for rel in changes(ck):
        path = ck.path / rel
        if not rel.endswith(".py") or not path.exists() or is_given(ck.chapter, rel):
            continue
        for qual, node in functions(ast.parse(path.read_text(encoding="utf-8"))):
            key = f"{rel}:{qual}"
            if _is_empty(node) or _only_stores(node) or any(fnmatch.fnmatchcase(key, k) for k in keep):
                continue
            if _dump(node) in old.get(qual, ()):
                continue
            hits = match(tasks, key, "symbols")
            out.append(Stub(rel, qual, node, hits[0] if len(hits) == 1 else None, key in same_file))
    return out


def stub_source(source: str, stubs: list[Stub], prev_name: str | None) -> str:
    """把 stubs 里每个函数的函数体（docstring 之后）换成一行 raise NotImplementedError。"""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    for s in stubs:
        stmts = body(s.node)
        label = s.task.label if s.task else "第 ? 章 · 任务 ?"
        hint = f"（上一章 {prev_name} 里有旧版本，改写它）" if s.changed and prev_name else ""
        raise_ = f"raise NotImplementedError({f'{label}：{s.qualname}{hint}'!r})"
        end = offsets[stmts[-1].end_lineno - 1] + _char_col(lines[stmts[-1].end_lineno - 1], stmts[-1].end_col_offset)
        start = offsets[stmts[0].lineno - 1] + _char_col(lines[stmts[0].lineno - 1], stmts[0].col_offset)
        edits.append((start, end, raise_))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _char_col(line: str, byte_col: int) -> int:
    """ast 的列号按 UTF-8 字节算；换成字符下标。"""
    return len(line.encode()[:byte_col].decode())


def _signature(s: Stub) -> str:
    """构造函数写成 Class(...)，方法去掉 self。"""
    n = s.node
    args = ast.unparse(n.args)
    if "." in s.qualname and args.split(",")[0].strip() in ("self", "cls"):
        args = args.split(",", 1)[1].strip() if "," in args else ""
    ret = f" -> {ast.unparse(n.returns)}" if n.returns and s.node.name != "__init__" else ""
    name = s.qualname.removesuffix(".__init__")
    decorators = {ast.unparse(d) for d in n.decorator_list}
    if "property" in decorators:
        return f"{name}{ret}（属性）"
    if decorators & {"cached_property", "functools.cached_property"}:  # 读的是 self.x，不是 self.x()
        return f"{name}{ret}（属性，算一次后缓存）"
    return f"{name}({args}){ret}"


def _inherited_doc(ck: Checkpoint, s: Stub) -> str:
    """函数自己没有 docstring 时，接口表的"说明"借一句：构造函数借类的 docstring；方法借基类（同一文件里的，
    或者从检查点里别的模块 import 进来的）的同名方法。"""
    parts = s.qualname.split(".")
    if len(parts) != 2:
        return ""
    todo, seen = [(s.file, parts[0])], set()
    while todo:
        rel, name = todo.pop(0)
        tree = _module(ck, rel)
        cls = next((n for n in getattr(tree, "body", []) if isinstance(n, ast.ClassDef) and n.name == name), None)
        if cls is None:  # 从别的模块 import 进来的基类：from .base import X / from minisgl.x import X
            mod = _imported_from(tree, rel, name)
            files = (f"{mod}.py", f"{mod}/__init__.py") if mod else ()
            where = next((c for c in files if (ck.path / c).is_file()), None)
            if where and (where, name) not in seen:
                seen.add((where, name))
                todo.append((where, name))
            continue
        if parts[1] == "__init__":
            return ast.get_docstring(cls) or ""
        if (rel, name) != (s.file, parts[0]):
            method = next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and n.name == parts[1]), None)
            if method is not None and ast.get_docstring(method):
                return ast.get_docstring(method)
        todo += [(rel, ast.unparse(b)) for b in cls.bases if (rel, ast.unparse(b)) not in seen]
        seen.update((rel, ast.unparse(b)) for b in cls.bases)
    return ""


def _module(ck: Checkpoint, rel: str) -> ast.Module | None:
    path = ck.path / rel
    return ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None


def _imported_from(tree: ast.Module | None, rel: str, name: str) -> str | None:
    """name 是从检查点里哪个模块 import 的（相对路径，不带 .py）；不是从检查点里 import 的时 None。"""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            if node.level:
                base = "/".join(rel.split("/")[:-node.level])
                mod = "/".join(filter(None, [base, *(node.module or "").split(".")]))
            elif (node.module or "").startswith("minisgl"):
                mod = node.module.replace(".", "/")
            else:
                return None
            return mod
    return None


def table_code(text: str) -> str:
    """表格单元格里的行内代码。类型注解里的 | 在反引号里转义不了（会显示成 \\|）：写成 <code>，| 用实体。"""
    if "|" not in text:
        return f"`{text}`"
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def first_sentence(doc: str) -> str:
    """docstring 第一段里到第一个句号为止（折行接回去）：只取第一行的话，折到下一行的半句就丢了。"""
    para = ""
    for line in doc.strip().splitlines():
        if not line.strip():
            break
        line = line.strip()
        space = para and para[-1].isascii() and line[0].isascii()  # 英文词之间折的行补一个空格，汉字之间不补
        para += (" " if space else "") + line
    return para.split("。")[0] + "。" if "。" in para else para


def interface_table(ck: Checkpoint) -> str:
    """本章要写的公开接口（名字不以 _ 开头，__init__ 除外），按任务分组的 Markdown 表。"""
    rows, private = ["| 任务 | 文件 | 接口 | 说明 |", "|---|---|---|---|"], []
    for s in sorted(find_stubs(ck), key=lambda s: s.task.number if s.task else 99):
        task = f"{s.task.number}" if s.task else "?"
        if any(part.startswith("_") and part != "__init__" for part in s.qualname.split(".")):
            private.append(f"`{s.qualname}`（任务 {task}）")
            continue
        line = first_sentence(ast.get_docstring(s.node) or _inherited_doc(ck, s)).replace("|", "\\|")
        rows.append(f"| {task} | `{s.file}` | {table_code(_signature(s))} | {line} |")
    if private:  # 内部函数不进表，但也是桩：点名，免得读者以为只写表里的就够
        rows.append(f"\n表外还有 {len(private)} 个内部函数（名字以 _ 开头，不算接口）也是桩：{'、'.join(private)}。")
    return "\n".join(rows)
