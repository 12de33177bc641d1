"""mkdocs 钩子：页面上"本章改了什么"和"运行结果"都在构建时现算，永远不会过时。

- {{ chapter_diff("ch2_ops") }}：新增 / 删除的文件清单，以及每个修改过的文件相对上一个检查点的 unified diff；
- {{ run("ch6_engine_sampler", "examples/stage1_milestone.py --page-size 4") }}：在那个检查点里运行脚本
  （PYTHONPATH 指向检查点和仓库根目录），把它的输出原样放进页面。命令里的 {model} 换成书用的真模型目录。
- {{ trace("ch4_kv_pool", "--page-size 1 --page-size 4") }}：构建时跑 python course.py trace（tools/trace/cli.py），
  写成网站里的 traces/页面名-N.html，页面上用 iframe 嵌进去；参数里的提示词用单引号。
- <!-- 接口 -->：本章要写的公开接口表（名字、签名、docstring 第一行），由 tools.workbench.stubs 从参考检查点现生成，
  和 python course.py start 写出的桩是同一份。
- {{ errors("ch3", 6) }}：第 3 章任务 6 的报错表，从 tests/ch3/errors.toml 现生成（tools/book/error_cases.py）；测试查的
  就是这一份，所以页面和测试不会说两样话。{{ errors("checkpoint") }} 是命令行契约的全部报错。紧跟在占位符下面、
  给读原文件的人看的那一行（error_cases.source_note：表只在构建好的书里）和占位符一起换掉。
- <!-- 模拟 CUDA 的规则 -->：模拟的 CUDA 守的跨设备规则表，从 tests/harness/cuda_emu/rules.toml 现生成。
- {{ config_keys("ch2") }}：第 2 章从 config.json 读的键，从 tests/ch2/config_keys.toml 现生成
  （tools/book/config_keys.py；下面那行 config_keys.source_note 一起换掉）。
- <!-- torch 接口 -->：读者要写的代码调的 torch.cuda / torch.distributed 接口表，从参考检查点现读
  （tools/book/torch_apis.py）。

书里的运行结果用真模型（tools.models.find.find_model：Qwen3-0.6B，否则 SmolLM2-135M，没有就从 PyPI 现做）；
取不到时退回离线小模型，页面上写明原因，构建不失败。
离线小模型（models/tiny/）在构建开始前生成，刚克隆的仓库直接 mkdocs build / serve 就行。
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.metadata
import logging
import os
import posixpath
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# mkdocs 按文件路径载入钩子、载入后还原 sys.path：这里加一次仓库根目录并立刻 import（之后 tools.X 走包的 __path__）
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.book import config_keys, error_cases, torch_apis  # noqa: E402
from tools.workbench import stubs  # noqa: E402
from tools.manifest import ROOT, checkpoint_files, find_checkpoint, is_given, load_manifest, tomllib  # noqa: E402

PATTERN = re.compile(r"\{\{\s*chapter_diff\(\"([\w]+)\"\)\s*\}\}")
INTERFACE = "<!-- 接口 -->"
CUDA_RULES = "<!-- 模拟 CUDA 的规则 -->"
TORCH_APIS = torch_apis.MARK
RUN = re.compile(r"\{\{\s*run\(\"([\w]+)\",\s*\"([^\"]+)\"\)\s*\}\}")
TRACE = re.compile(r"\{\{\s*trace\(\"([\w]+)\",\s*\"([^\"]*)\"\)\s*\}\}")
ERRORS = re.compile(r"\{\{\s*errors\(\"(\w+)\"(?:,\s*(\d+))?\)\s*\}\}"
                    + rf"(?:\n{re.escape(error_cases.SOURCE_NOTE)}[^\n]*)?")
CONFIG_KEYS = re.compile(r"\{\{\s*config_keys\(\"(\w+)\"\)\s*\}\}"
                         + rf"(?:\n{re.escape(config_keys.SOURCE_NOTE)}[^\n]*)?")
TRACE_FILES: dict[str, str] = {}  # 网站里的路径 -> 这次构建生成的 HTML，on_post_build 写出
TRACE_SECONDS: list[float] = []
log = logging.getLogger("mkdocs.hooks.trace")


def chapter_diff(name: str) -> str:
    manifest = load_manifest()
    names = [c.name for c in manifest]
    if name not in names or names.index(name) == 0:
        raise ValueError(f"chapter_diff({name!r})：清单里没有这个检查点，或者它没有上一个检查点")
    cur = manifest[names.index(name)]
    prev = manifest[names.index(name) - 1]
    a, b = checkpoint_files(prev.path), checkpoint_files(cur.path)
    added = [f for f in cur.changes if f not in a]
    removed = [f for f in cur.changes if f not in b]
    out = [f"相对 `{prev.name}`：新增 {len(added)} 个文件，删除 {len(removed)} 个，"
           f"修改 {len(cur.changes) - len(added) - len(removed)} 个；其余文件逐字节相同（测试保证）。", ""]
    for f in added:
        given = "，给定的代码" if is_given(cur.chapter, f) else ""  # 整份复制给读者，不是本章要写的
        out.append(f"- 新增 `{name}/{f}`（{b[f].decode().count(chr(10))} 行{given}）")
    for f in removed:
        out.append(f"- 删除 `{prev.name}/{f}`")
    for f in cur.changes:
        if f in a and f in b:
            diff = difflib.unified_diff(a[f].decode().splitlines(), b[f].decode().splitlines(),
                                        f"{prev.name}/{f}", f"{name}/{f}", lineterm="", n=2)
            given = "（给定的代码）" if is_given(cur.chapter, f) else ""
            out += ["", f'??? note "修改 `{f}`{given}"', "", "    ```diff"]
            out += [f"    {line}" for line in diff]
            out.append("    ```")
    return "\n".join(out)


@functools.cache
def book_model() -> tuple[Path, str | None]:
    """(模型目录, 退回小模型的原因)；整次构建只问一次 tools.models.find.find_model。"""
    from tools.models.find import find_model

    choice = find_model(make=True, tiny=True, quiet=True)
    return choice.path, choice.why_tiny


def run(checkpoint: str, command: str) -> str:
    """在检查点目录里运行一个脚本，返回一段 text 代码块；脚本失败就让构建失败。"""
    cwd = ROOT / checkpoint
    model, why_tiny = book_model()  # 里程碑脚本自己去 models/ 下找，所以先把模型做好
    # 检查点在前（import minisgl 得到它），仓库根目录在后（命令也可以是 -m tools.X）
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), str(ROOT)]),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    argv = [a.replace("{model}", str(model)) for a in shlex.split(command)]
    res = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"run({checkpoint!r}, {command!r}) 失败：\n{res.stderr[-3000:]}")
    note = ""
    if why_tiny:
        note = (f'!!! note "这次构建没有真模型，下面是离线小模型的输出（乱码，但和 HF 逐 token 一致）"\n\n'
                f"    {why_tiny}\n\n")
    return note + "```text\n" + res.stdout.rstrip() + "\n```"


TRACE_CACHE = ROOT / ".cache" / "traces"


def trace_key(checkpoint: str, args: str, model: Path) -> str:
    """一份记录只取决于这些：检查点的文件、trace 工具本身、模型目录、参数和 torch / transformers 的版本。"""
    h = hashlib.sha256("\0".join([checkpoint, args, str(model), importlib.metadata.version("torch"),
                                   importlib.metadata.version("transformers")]).encode())
    for name, data in checkpoint_files(ROOT / checkpoint).items():
        h.update(name.encode() + b"\0" + data)
    for p in sorted([*(ROOT / "tools" / "trace").glob("*.py"), *(ROOT / "tools" / "trace" / "assets").iterdir()]):
        h.update(p.read_bytes())
    for p in sorted(model.iterdir()):
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def trace(checkpoint: str, args: str, page) -> str:
    """构建时跑一次 tools.trace（书用的模型），返回嵌进页面的 iframe；检查点出错就让构建失败。
    输入都没变时用 .cache/traces/ 里上次的结果（mkdocs serve 每次重建、测试再构建一遍都不再重跑）。"""
    from tools.trace import cli as tracer

    model, why_tiny = book_model()
    stem = Path(page.file.src_uri).stem
    name = f"traces/{stem}-{sum(k.startswith(f'traces/{stem}-') for k in TRACE_FILES) + 1}.html"
    t0 = time.perf_counter()
    cached = TRACE_CACHE / f"{trace_key(checkpoint, args, model)}.html"
    if not cached.is_file():
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "trace.html"
            traces, _, _ = tracer.trace([checkpoint, *shlex.split(args), "--model", str(model), "-o", str(out)])
            if bad := [t for t in traces if t["error"]]:
                raise RuntimeError(f"trace({checkpoint!r}, {args!r})：{bad[0]['checkpoint']} 出错：{bad[0]['error']}")
            TRACE_CACHE.mkdir(parents=True, exist_ok=True)
            part = cached.with_suffix(f".{os.getpid()}.part")  # 写完再改名：同时构建的另一个进程读不到半个文件
            part.write_bytes(out.read_bytes())
            os.replace(part, cached)
    TRACE_FILES[name] = cached.read_text(encoding="utf-8")
    TRACE_SECONDS.append(time.perf_counter() - t0)
    src = posixpath.relpath(name, posixpath.dirname(page.file.dest_uri))
    note = ""
    if why_tiny:
        note = (f'!!! note "这次构建没有真模型，下面记录的是离线小模型（生成的文字是乱码，每一步的数照样是真的）"\n\n'
                f"    {why_tiny}\n\n")
    return (note + f'<iframe class="trace-embed" src="{src}" title="引擎的每一步：{checkpoint}"></iframe>\n\n'
            f'<p class="trace-open"><a href="{src}" target="_blank">在新标签页里打开这份记录</a>'
            f"（左右方向键换步；鼠标停在槽位上看它属于哪个请求的哪个位置）</p>")


def on_post_build(config) -> None:
    """把这次构建生成的 trace 写进网站目录；记一笔它们给构建加了多少时间。"""
    for name, html in TRACE_FILES.items():
        path = Path(config["site_dir"]) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    if TRACE_SECONDS:
        log.info(f"trace：{len(TRACE_SECONDS)} 份记录，构建多花了 {sum(TRACE_SECONDS):.1f} 秒")
    TRACE_FILES.clear()
    TRACE_SECONDS.clear()


def on_pre_build(config) -> None:
    """刚克隆时还没有 models/tiny/（测试第一次运行时才生成）：在这里生成；已经有了就直接复用，几乎不花时间。"""
    from tools.models.make_tiny_models import make_all

    TRACE_FILES.clear()  # mkdocs serve 每次重建都从这里开始
    TRACE_SECONDS.clear()
    make_all()


def interface(page_file: str) -> str:
    """页面 chN.md / step0.md 对应的检查点的接口表。"""
    tag = Path(page_file).stem
    ck = find_checkpoint(tag)
    return (f"本章要写的接口（`python course.py start {tag}` 把它们写成桩，函数体是 `raise NotImplementedError`）：\n\n"
            + stubs.interface_table(ck))


def render_errors(markdown: str) -> str:
    """每个 {{ errors(…) }}（连同下面那行 source_note）换成报错表。"""
    return ERRORS.sub(lambda m: error_cases.render_table(m.group(1), int(m.group(2)) if m.group(2) else None),
                      markdown)


def render_config_keys(markdown: str) -> str:
    """每个 {{ config_keys(…) }}（连同下面那行 source_note）换成那一章的 config.json 键表。"""
    return CONFIG_KEYS.sub(lambda m: config_keys.render_table(m.group(1)), markdown)


def cuda_rules_table() -> str:
    """模拟的 CUDA 的规则表：读测试用的同一份 tests/harness/cuda_emu/rules.toml（数据，不 import tests/）。"""
    rules = tomllib.loads((ROOT / "tests" / "harness" / "cuda_emu" / "rules.toml").read_text(encoding="utf-8"))["rule"]
    rows = [f"| `{r['name']}` | {r['what']} | {r['cuda']} |" for r in rules]
    return "\n".join(["| 规则 | 模拟里做什么 | 照抄的 CUDA 行为 |", "|---|---|---|", *rows])


def on_page_markdown(markdown: str, page, config, files) -> str:
    if INTERFACE in markdown:
        markdown = markdown.replace(INTERFACE, interface(page.file.src_uri))
    if CUDA_RULES in markdown:
        markdown = markdown.replace(CUDA_RULES, cuda_rules_table())
    if TORCH_APIS in markdown:
        markdown = markdown.replace(TORCH_APIS, torch_apis.table(find_checkpoint(Path(page.file.src_uri).stem)))
    markdown = render_errors(markdown)
    markdown = render_config_keys(markdown)
    markdown = RUN.sub(lambda m: run(m.group(1), m.group(2)), markdown)
    markdown = TRACE.sub(lambda m: trace(m.group(1), m.group(2), page), markdown)
    return PATTERN.sub(lambda m: chapter_diff(m.group(1)), markdown)
