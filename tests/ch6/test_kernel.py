"""minisgl.kernel：C++ 矩阵乘（1~8 行的 small_linear、更多行的 gemm）和它的 F.linear 退路，在每台机器上都跑两条路。

- 有 C++ 编译器和 ninja 的机器上核必须编得出来（CI 有 gcc）：编不出来就失败，不悄悄退回 F.linear；
- 核的结果和 float64 的参考只差 fp32 的舍入，在不好对齐的形状上（in 不是向量宽度的倍数、out 不是 4 的倍数、
  1~8 行和 prefill 的多行、有没有 bias、输入不连续）逐个核对；别的 dtype、不是二维的输入，线性层结果就是 F.linear；
- 退路（MINISGL_KERNEL=off、编译失败）打印一行原因，之后各层用 F.linear 和前几章的算式；
- 缓存按源码内容分开；
- 经由 Engine，两条路都和 HF 逐 token 相同。
只核对数值，从不断言耗时（速度见 python -m tools.bench）。"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tools.manifest import ROOT

# 误差上界（相对 Σ|x·w|，这是点积舍入误差的自然尺度）：分块求和的最坏情况约 (in/宽度 + 宽度)·eps，
# in ≤ 3072、宽度 4~16 时不到 1e-5；MKL 自己对 float64 的误差也在这个量级
RTOL_ABS_DOT = 1e-5
SHAPES = [(1, 1), (3, 5), (14, 40), (33, 17), (160, 96), (97, 1023), (256, 3072), (7, 0), (0, 8)]  # (out, in)；含空的维
# 输出行数除以 3、4 的余数各种都有（AVX2 上 prefill 式的小块是 3 行权重，别的是 4 行）。
# small_linear 的两种读法都走到：(97, 1023) 的 1~4 行输入不超过 16 KB，一行一行顺着读，1023 还凑不满一次走的几个向量；
# (256, 3072) 的 2 行起超过 16 KB，换寄存器小块


def _ext():
    from minisgl import kernel

    return kernel.extension()


def _missing_toolchain() -> str:
    """缺的编译工具（空串：都在）。"""
    from torch.utils.cpp_extension import is_ninja_available

    cxx = os.environ.get("CXX", "c++")
    missing = [f"C++ 编译器 {cxx}"] if not shutil.which(cxx) else []
    return "、".join(missing + ([] if is_ninja_available() else ["ninja"]))


def _has_toolchain() -> bool:
    return not _missing_toolchain()


def _ext_or_skip():
    """编出来的扩展；没有工具链时跳过并说缺什么；编出的库报错路径没过 probe（utils.refusal()）时跳过并说原因。
    有工具链、也没被拒绝，却没编出来是失败，不是跳过。"""
    from minisgl.kernel import utils

    ext = _ext()
    if ext is None:
        if why := utils.refusal():
            pytest.skip(f"这台机器的工具链被拒绝：{why}。只有 PyTorch 退路，C++ 核没有可测的")
        assert not _has_toolchain(), "这台机器有 C++ 编译器和 ninja，minisgl.kernel 却没编出来（看上面那行原因）"
        pytest.skip(f"没有 {_missing_toolchain()}：只有 PyTorch 退路，C++ 核没有可测的")
    return ext


def test_kernel_builds_where_a_compiler_is():
    """有编译器和 ninja（requirements.txt 钉了 PyPI 的 ninja）就必须编得出来：退回 F.linear 的机器要能看出来。"""
    if _has_toolchain():
        ext = _ext_or_skip()
        assert ext.max_rows == 8 and ext.vector_width in (4, 8, 16)
    else:
        assert _ext() is None


@pytest.mark.parametrize("rows", [*range(1, 9), 9, 13, 30, 67])  # 9 行起是 gemm：凑不满一块输入行、凑不满一块权重行
@pytest.mark.parametrize("out,inp", SHAPES)
@pytest.mark.parametrize("has_bias", [True, False])
def test_kernel_matches_float64(rows, out, inp, has_bias, monkeypatch):
    """1~8 行时每种读法都核对一遍（经 MINISGL_KERNEL_VARIANT 强制，线性层查的就是那张表）。"""
    ext = _ext_or_skip()
    g = torch.Generator().manual_seed(rows * 1000 + out)
    x, w = torch.randn(rows, inp, generator=g), torch.randn(out, inp, generator=g) * 0.05
    b = torch.randn(out, generator=g) if has_bias else None
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    scale = x.double().abs() @ w.double().abs().t() + (0 if b is None else b.double().abs())
    for variant in (each_variant(ext, monkeypatch, rows) if rows <= ext.max_rows else ["gemm"]):
        got = ext.linear(x, w, b)
        assert got.shape == (rows, out) and got.dtype == torch.float32 and got.is_contiguous()
        err = ((got.double() - ref).abs() / scale.clamp_min(1e-30)).max().item() if got.numel() else 0.0
        assert err <= RTOL_ABS_DOT, (f"{variant}：({rows}, {inp}) × ({out}, {inp})ᵀ：误差 {err:.2e} × Σ|x·w|，"
                                     f"超过 {RTOL_ABS_DOT}")
        # 和 F.linear（MKL）之间也只差累加顺序
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-4, atol=1e-5)


def each_variant(ext, monkeypatch, rows: int):
    """管得了 rows 行的每种读法：经 MINISGL_KERNEL_VARIANT 强制它、重新定表（和读者设了环境变量再起进程一样），
    核对表里真是它；最后还原原来的表。"""
    from minisgl.kernel import plan

    before = ext.get_plan()
    try:
        for i, (name, lim) in enumerate(zip(ext.variants, ext.variant_rows)):
            if rows <= lim:
                monkeypatch.setenv(plan.VARIANT_ENV, name)
                plan.install(ext)
                assert ext.get_plan()[rows - 1] == i
                yield name
    finally:
        monkeypatch.delenv(plan.VARIANT_ENV, raising=False)
        ext.set_plan(before)


def test_kernel_takes_non_contiguous_input():
    ext = _ext_or_skip()
    w, b = torch.randn(33, 17), torch.randn(33)
    base = torch.randn(17, 8)
    for x in (base.t(), torch.randn(4, 34)[:, ::2]):  # 转置的 view、隔列取的 view
        assert not x.is_contiguous()
        torch.testing.assert_close(ext.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_kernel_result_does_not_depend_on_thread_count():
    """每个输出元素由一个线程从头算到尾：换线程数，结果逐位相同（--tp 下各 rank 线程数不同也一样）。"""
    ext = _ext_or_skip()
    w = torch.randn(3001, 1000)
    before = torch.get_num_threads()
    wide = torch.randn(301, 5000)  # 2 行输入就超过 16 KB：寄存器小块那条路
    for fn, x, wt in ((ext.small_linear, torch.randn(1, 1000), w), (ext.small_linear, torch.randn(2, 1000), w),
                      (ext.small_linear, torch.randn(4, 1000), w), (ext.small_linear, torch.randn(2, 5000), wide),
                      (ext.gemm, torch.randn(45, 1000), w)):
        try:
            outs = []
            for t in (1, 2, 3):
                torch.set_num_threads(t)
                outs.append(fn(x, wt, None))
        finally:
            torch.set_num_threads(before)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_num_threads_says_how_many_threads_the_kernel_really_uses():
    """带 OpenMP 编的核用 torch 的 OpenMP 线程池，MINISGL_KERNEL_OPENMP=0（Apple 的 clang 同样）编的核由 parallel.h
    直接调 torch 载入的 OpenMP 运行库：两种都跟着 torch 的线程数。CI 把第 6 章的测试在 MINISGL_KERNEL_OPENMP=0 下
    再跑一遍，两种都核对到。"""
    from minisgl.kernel import utils

    ext = _ext()
    if ext is None:
        assert (not _has_toolchain() or utils.refusal()) and utils.num_threads() is None
        return
    before = torch.get_num_threads()
    try:
        for t in (2, 3, 1):
            torch.set_num_threads(t)
            assert utils.num_threads() == ext.num_threads() == t
    finally:
        torch.set_num_threads(before)


def test_the_openmp_switch_has_its_own_cache_key(monkeypatch):
    """MINISGL_KERNEL_OPENMP=0 不带 -fopenmp 编，缓存另存一份：两种库不互相顶替。utils 在 import 时读这个环境变量，
    所以每种设法都从文件新载入一份模块来读（和读者设了环境变量再起进程一样），不动已经载入的那份"""
    import minisgl

    def fresh(value: str | None):
        if value is None:
            monkeypatch.delenv("MINISGL_KERNEL_OPENMP", raising=False)
        else:
            monkeypatch.setenv("MINISGL_KERNEL_OPENMP", value)
        spec = importlib.util.spec_from_file_location(
            "_utils_fresh", Path(minisgl.__file__).parent / "kernel" / "utils.py")
        u = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(u)
        return u.OPENMP, "-fopenmp" in u.FLAGS, u.cache_key([u.CSRC / s for s in u.SOURCES])

    off, on, default = fresh("0"), fresh("1"), fresh(None)
    assert off[:2] == (False, False)
    assert on[:2] == (True, True)
    assert default[:2] == ((True, True) if sys.platform.startswith("linux") else (False, False))
    assert off[2] != on[2]


def test_the_compiler_is_in_the_cache_key(monkeypatch):
    """g++ 和 clang++ 编的库各存一份：一个被拒绝（probe）时，换另一个会重新编、重新试，不会读到它的结论。"""
    from minisgl.kernel import utils

    paths = [utils.CSRC / s for s in utils.SOURCES]
    keys = set()
    for cxx in ("g++", "clang++", "c++"):
        monkeypatch.setenv("CXX", cxx)
        keys.add(utils.cache_key(paths))
    monkeypatch.delenv("CXX")
    assert len(keys) == 3 and utils.cache_key(paths) in keys  # 没设 CXX 就是 c++


@pytest.mark.parametrize("n", [0, 1, 7, 1 << 16, (1 << 16) + 3, 3 * (1 << 18) + 5])  # 凑不满一个线程、一段、一个向量
def test_stream_read_reads_every_element_once(n):
    """tools/bench 拿 stream_read 量读带宽（下限）：它得真把每个数读一遍，一个不漏、一个不重。"""
    ext = _ext_or_skip()
    # 1~3 的整数：fp32 的部分和都在 2^24 以内、没有舍入，漏读、重读一个数，和都会变
    x = torch.randint(1, 4, (n,), generator=torch.Generator().manual_seed(n)).float()
    assert ext.stream_read(x) == x.long().sum().item()


def test_fma_peak_counts_multiply_adds_per_second():
    """tools/bench 拿 fma_peak 量乘加的峰值（算的下限）：做的乘加翻倍，时间也该翻倍，量出的速率不随次数变；
    次数不是正数时说一行、不去算。"""
    ext = _ext_or_skip()
    rates = [max(ext.fma_peak(iters) for _ in range(3)) for iters in (1 << 18, 1 << 19)]
    assert all(math.isfinite(r) and r > 1e8 for r in rates), rates  # 每秒至少 1 亿次：任何能跑测试的 CPU
    assert 0.5 < rates[1] / rates[0] < 2.0, f"次数翻倍，速率不该变一倍以上：{rates}"
    with pytest.raises(RuntimeError, match="fma_peak: iters must be positive, got 0"):
        ext.fma_peak(0)


def test_linear_uses_small_linear_for_1_to_8_rows_and_gemm_above():
    """ext.linear（线性层绑定的那个）：1~8 行的二维输入就是 small_linear 的结果，更多行就是 gemm 的，逐位相同。"""
    ext = _ext_or_skip()
    w, b = torch.randn(37, 70), torch.randn(37)
    for rows in (1, 4, 8):
        x = torch.randn(rows, 70)
        assert torch.equal(ext.linear(x, w, b), ext.small_linear(x, w, b))
    for rows in (9, 32, 130):
        x = torch.randn(rows, 70)
        assert torch.equal(ext.linear(x, w, b), ext.gemm(x, w, b))


@pytest.mark.parametrize("case", ["float64", "bfloat16", "一维输入"])
def test_everything_else_goes_to_f_linear(case):
    """核只管 CPU 上 fp32 的二维输入；别的（别的 dtype 的层、不是二维的输入）原样交给 F.linear，结果逐位相同。"""
    from minisgl.distributed import set_tp_info
    from minisgl.layers import LinearReplicated
    from minisgl.utils import torch_dtype

    x, w, b = {"float64": (torch.randn(2, 16).double(), torch.randn(5, 16).double(), None),
               "bfloat16": (torch.randn(2, 16).bfloat16(), torch.randn(5, 16).bfloat16(), None),
               "一维输入": (torch.randn(16), torch.randn(5, 16), None)}[case]
    set_tp_info(0, 1)
    with torch_dtype(w.dtype):
        layer = LinearReplicated(16, 5, has_bias=b is not None)
    layer.load_state_dict({"weight": w} if b is None else {"weight": w, "bias": b})
    assert torch.equal(layer.forward(x), F.linear(x, w, b))


def test_shape_mismatch_is_refused_in_one_line():
    ext = _ext_or_skip()
    x, w = torch.randn(2, 16), torch.randn(5, 15)
    with pytest.raises(RuntimeError) as e:
        ext.small_linear(x, w)
    msg = str(e.value).splitlines()[0]
    assert msg == f"small_linear: shapes {list(x.shape)} and {list(w.shape)} do not match"
    with pytest.raises(RuntimeError, match="at most 8 rows"):
        ext.small_linear(torch.randn(9, 16), torch.randn(5, 16))
    with pytest.raises(RuntimeError) as e:
        ext.gemm(torch.randn(20, 16), w)
    assert str(e.value).splitlines()[0] == "gemm: shapes [20, 16] and [5, 15] do not match"
    with pytest.raises(RuntimeError) as e:
        ext.gemm(torch.randn(20, 15), w, torch.randn(4))
    assert str(e.value).splitlines()[0] == "gemm: bias must be CPU fp32 of 5"


# ---------------------------------------------------------------- 退路：说一行原因，之后就是 PyTorch 的写法


@pytest.fixture
def fresh_extension():
    from minisgl.kernel import utils

    utils.extension.cache_clear()
    yield utils
    utils.extension.cache_clear()  # 下一个测试重新加载（有缓存，不会再编译）


def _plain_linear():
    """一个刚加载好 fp32 权重的线性层：它在加载时按扩展在不在选矩阵乘。"""
    from minisgl.distributed import reset_tp_info, set_tp_info
    from minisgl.layers import LinearReplicated

    reset_tp_info()
    set_tp_info(0, 1)
    layer = LinearReplicated(16, 5, has_bias=True)
    w, b = torch.randn(5, 16), torch.randn(5)
    layer.load_state_dict({"weight": w, "bias": b})
    return layer, w, b


def test_off_switch_prints_one_line_and_uses_f_linear(fresh_extension, monkeypatch, capsys):
    monkeypatch.setenv("MINISGL_KERNEL", "off")
    x = torch.randn(2, 16)
    for _ in range(2):  # 只说一次
        layer, w, b = _plain_linear()
        assert torch.equal(layer.forward(x), F.linear(x, w, b))
    assert fresh_extension.cpu_op("linear", w) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["minisgl.kernel：MINISGL_KERNEL=off，全用 PyTorch 的算子（F.linear、F.rms_norm……）"]


def test_build_failure_prints_one_line_and_uses_f_linear(fresh_extension, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("Error building extension 'minisgl_kernel'\nc++: not found\n... 很长的编译日志")

    monkeypatch.setattr(fresh_extension, "load_jit", broken)
    layer, w, b = _plain_linear()
    x = torch.randn(3, 16)
    assert torch.equal(layer.forward(x), F.linear(x, w, b))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"编译 {'、'.join(fresh_extension.SOURCES)} 失败（" in err[0]
    reason = "Error building extension 'minisgl_kernel'"  # 原因只取第一行
    assert f"（{reason}）" in err[0]
    assert "改用 PyTorch 的算子" in err[0] and "C++ 编译器" in err[0] and "pip install ninja" in err[0]
    assert "Traceback" not in err[0]


def test_no_compiler_is_said_in_one_line(fresh_extension, monkeypatch, tmp_path, capsys):
    """没有能用的 C++ 编译器（CXX=false，或 PATH 上没有 c++）：不去编，说一行原因，之后全用 PyTorch 的算子。"""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))  # 空缓存：不会读到别处编好的库
    for cxx, said in (("false", "C++ 编译器 false 运行不了"), ("no-such-c++", "找不到 C++ 编译器 no-such-c++")):
        fresh_extension.extension.cache_clear()
        monkeypatch.setenv("CXX", cxx)
        layer, w, b = _plain_linear()
        x = torch.randn(3, 16)
        assert torch.equal(layer.forward(x), F.linear(x, w, b))
        assert fresh_extension.extension() is None  # 同一进程里不再试
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and "改用 PyTorch 的算子" in err[0], err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


def _crashing_build(crash: bool):
    """代替 utils.run_build 的子进程：编出一个（空的）库，然后像报错路径崩溃的库那样被 SIGSEGV 杀掉；
    crash=False 时 probe 发现报错不对、写下原因（和 utils.py 的子进程一样）。记下被调了几次。"""
    calls = []

    def run_build(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        calls.append(cmd)
        lib = Path(cmd[3]) / f"{cmd[2]}.so"
        lib.write_bytes(b"")
        if not crash:
            lib.with_suffix(".refused").write_text("这套工具链编出的核该报错时没有报错（small_linear: ...）")
            return subprocess.CompletedProcess(cmd, 1, "", "这套工具链编出的核该报错时没有报错（small_linear: ...）")
        code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)

    return run_build, calls


@pytest.mark.parametrize("crash", [True, False])
def test_a_library_whose_error_path_fails_the_probe_is_refused_in_one_line(fresh_extension, monkeypatch, tmp_path,
                                                                          capsys, crash):
    """编出的库报错时让进程崩溃（或报错不对）：在编它的子进程里就试出来，本进程说一行原因、改用 PyTorch 的算子；
    结论和库放在一起，之后的进程不再编、不再试（run_build 只跑一次）。"""
    run_build, calls = _crashing_build(crash)
    monkeypatch.setattr(fresh_extension, "run_build", run_build)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    for _ in range(2):  # 第二次是"下一个进程"：读缓存里的结论
        fresh_extension.extension.cache_clear()
        layer, w, b = _plain_linear()
        x = torch.randn(3, 16)
        assert torch.equal(layer.forward(x), F.linear(x, w, b))
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "改用 PyTorch 的算子" in err[0] and "Traceback" not in err[0], err
        why = "会让进程崩溃（signal 11，SIGSEGV）" if crash else "该报错时没有报错"
        assert why in err[0] and why in fresh_extension.refusal()
    assert len(calls) == 1 and fresh_extension.num_threads() is None


def test_the_probe_finds_an_error_path_that_does_not_raise():
    """probe 本身：该报错的调用没有报错、或者报的不是那一行，都说出来；真编出的核过得了它。"""
    from minisgl.kernel import utils

    class Silent:
        def __getattr__(self, name):
            return lambda *args: None

    class Wrong:
        def __getattr__(self, name):
            def call(*args):
                raise RuntimeError("something else")
            return call

    before = torch.get_num_threads()
    try:
        assert "该报错时没有报错" in utils.probe(Silent())
        assert "报错不对" in utils.probe(Wrong()) and "something else" in utils.probe(Wrong())
        assert utils.probe(_ext_or_skip()) is None
    finally:
        torch.set_num_threads(before)


def test_a_compile_error_comes_back_in_one_line(fresh_extension, monkeypatch, tmp_path):
    """真的编一份编不过的源码（在子进程里，和第一次用时一样）：load_jit 抛出的错，第一行说清是哪个扩展编不出来。
    源码不 include torch 的头文件：编译器读那些头文件要二十多秒，错在第一行就够了。"""
    (tmp_path / "include").mkdir()
    (tmp_path / "broken.cpp").write_text("this is not C++;\n")
    monkeypatch.setattr(fresh_extension, "CSRC", tmp_path)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError) as e:
        fresh_extension.load_jit("minisgl_broken", ["broken.cpp"])
    first = str(e.value).splitlines()[0]
    assert "minisgl_broken" in first or "Ninja is required" in first, first


def test_the_cache_follows_the_source_content(fresh_extension, monkeypatch, tmp_path):
    """检查点和读者的工作区各有一份同样的源码：键相同，共用一份缓存；改了源码或头文件就是另一份，
    不会在两份之间来回重编（每次半分钟），也不会加载到旧源码编出来的库。"""
    copies = [tmp_path / "a", tmp_path / "b"]
    for d in copies:
        shutil.copytree(fresh_extension.CSRC, d)

    def key(d: Path) -> str:
        monkeypatch.setattr(fresh_extension, "CSRC", d)
        return fresh_extension.cache_key([d / s for s in fresh_extension.SOURCES])

    assert key(copies[0]) == key(copies[1])
    (copies[1] / "decode_ops.cpp").write_text((copies[1] / "decode_ops.cpp").read_text() + "// 改一行\n")
    assert key(copies[0]) != key(copies[1])
    header = next((copies[0] / "include").glob("*.h"))
    before = key(copies[0])
    header.write_text(header.read_text() + "// 改一行\n")
    assert key(copies[0]) != before


def test_kernel_package_does_not_import_layers():
    """layers 调 kernel，kernel 不认识 layers：它只是一个矩阵乘。"""
    pkg = ROOT / "ch6_engine_sampler" / "minisgl" / "kernel"
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(p in n for n in names for p in ("layers", "models", "engine")), f"{path.name} 导入了 {names}"


# ---------------------------------------------------------------- 经由 Engine：两条路都和 HF 逐 token 相同


@pytest.fixture
def fresh_rope():
    """get_rope 按配置缓存、所有层共用，RoPE 在构造时选一次写法：清掉缓存，这次的 Engine 才会重新选。"""
    from minisgl.layers.rotary import _get_rope

    _get_rope.cache_clear()
    yield
    _get_rope.cache_clear()


@pytest.mark.parametrize("path", ["kernel", "F.linear"])
@pytest.mark.parametrize("name", ["qwen3-tied", "qwen3-untied", "qwen2", "llama3"])
def test_engine_matches_hf_on_both_paths(tiny_models, monkeypatch, fresh_rope, path, name):
    """batch 里 4 个提示词经由 Engine 生成 8 个，和 HF 逐 token 相同：走核（decode 的 1~4 行和小算子）和全走 PyTorch
    （F.linear 和前几章的算式：扩展用不了时各层在构造、加载时都选 PyTorch 的写法）都一样。
    同时核对核真的被调用了（或真的没被调用）。"""
    from minisgl.kernel import utils

    from tests.ch6.test_engine import engine_of, generate
    from tools.manifest import PROMPTS
    from tests.harness.reference import encode, hf_greedy

    calls = []
    real = utils.extension()
    if path == "F.linear":
        monkeypatch.setattr(utils, "extension", lambda: None)
    elif real is not None:
        class Counting:
            def linear(self, *args):
                calls.append(args[0].shape[0])
                return real.linear(*args)

            def __getattr__(self, name):  # 其余的小算子（decode_ops.cpp）照常用
                return getattr(real, name)

        monkeypatch.setattr(utils, "extension", lambda: Counting())
    model = tiny_models[name]
    with engine_of(model, device="cpu") as e:  # 核是 CPU 上的：有 GPU 的机器上也测 CPU 上的引擎
        got = generate(e, [encode(model, p) for p in PROMPTS], 8)
    if path == "kernel" and real is not None:
        assert any(1 <= n <= 8 for n in calls), "decode 的线性层没有走核"
    for p, g in zip(PROMPTS, got):
        assert g == hf_greedy(str(model), p, 8)[0], f"{name}（{path}）：{p[:30]!r}"
