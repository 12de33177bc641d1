"""在别的 CPU 架构上真的跑测试：python course.py test --arch aarch64 [chN …]（x86 的 Linux，用 qemu-user 模拟）。

第 6 章的 C++ 核有一段 `#if defined(__aarch64__)`，x86 上从来编不到它。这里用 mmdebstrap 建一个 arm64 的 Debian bookworm
根文件系统（python3、python3-dev、g++），建 venv，装 PyPI 的 aarch64 wheel（requirements.txt 钉的版本，只装测试要的；
aarch64 的 torch 带着 CUDA 的库，约 3 GB），缓存在用户的缓存目录里（约 5 GB，不在仓库里；在哪、怎么删见
tools/arch/cache.py，--clean 删掉它），版本一变就重建。每次把工作区（git 跟踪的和没被忽略的文件，只拷普通文件和
指向仓库里面的链接）拷进根里的 /src，在私有的 mount 命名空间里 chroot 进去跑 pytest：程序由 binfmt_misc 交给
qemu-aarch64 执行，C++ 核由根里的 g++ 按 utils.py 的选项现编。-mcpu=native 也编得过：qemu-user 的 /proc/cpuinfo 是本机
（x86）的，gcc 认不出型号，退回通用的 armv8-a（NEON，128 位），正是那段代码的基线。不挂本机的 /sys（aarch64 的 torch
读到 x86 的 /sys 会在 import 时崩），只给一个 tmpfs，写明有几个 CPU（torch 的 cpuinfo 库没有它就初始化失败，fp16 随之
报错）。跑点名的检查点（默认第 6 章）的全部小模型一档。要 root；缺的工具用 apt-get 装。
跑不了时说一行原因、退出码非 0，不假装跑过。
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tools import run_tests
from tools.arch import cache as arch_cache
from tools.arch.cache import Refused, sync_src
from tools.manifest import ROOT, by_name, load_manifest

ARCHS = {"aarch64": "arm64"}  # --arch 的名字 -> Debian 的架构名
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
DEBS = ("python3", "python3-venv", "python3-dev", "g++")
PY = "3.11"  # bookworm 的 python3；装 wheel 时按它选
WHEELS = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "pytest", "hypothesis",
          "ninja")  # 测试要的；mkdocs、playwright、gguf 是文档和真权重一档的，这里不跑
HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "update-binfmts": "binfmt-support", "unshare": "util-linux",
              "qemu-aarch64-static": "qemu-user-static"}  # 本机要的命令 -> 装它的 Debian 包
# 模拟 Neoverse-N1（Graviton2、Ampere Altra）。qemu 默认的 max 带 512 位 SVE，wheel 里 oneDNN 的 fp32 矩阵乘
# （brg:sve_512）在 qemu 7.2 下算错（差到 1 以上；SVE 128、256 位和不带 SVE 都对）：那测的是模拟器和 torch，不是我们的核
QEMU_CPU = "neoverse-n1"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
CACHE, OLD = arch_cache.CACHE, arch_cache.OLD  # 根在哪（用户的缓存目录）；旧版本放在仓库里的地方
DEFAULT = "ch6_engine_sampler"  # 不点名时跑的检查点：C++ 核只在第 6 章


def parse(extra: list[str]) -> tuple[str, list[str], bool]:
    """--arch X、--no-real（本来就只跑小模型一档）、--clean 和检查点名字 -> (架构, 检查点目录名, 是否 --clean)；
    别的一律拒绝。"""
    arch, names, rest, clean = None, [], list(extra), False
    while rest:
        a = rest.pop(0)
        if a == "--arch" or a.startswith("--arch="):
            arch = a[len("--arch="):] if "=" in a else (rest.pop(0) if rest else "")
        elif a == "--clean":
            clean = True
        elif a == "--real":
            raise Refused("--arch 只跑小模型一档（模拟器里跑真模型太慢）：去掉 --real", 2)
        elif a.startswith("-") and a != "--no-real":
            raise Refused(f"--arch 不认识 {a}：只接受 --arch aarch64、--no-real、--clean 和检查点名字（ch1 … ch6）", 2)
        elif not a.startswith("-"):
            names.append(a)
    if arch not in ARCHS:
        raise Refused(f"--arch 只支持 {'、'.join(ARCHS)}，给的是 {arch or '（空）'}", 2)
    if bad := [n for n in names if by_name(n) is None]:
        known = ", ".join(c.name for c in load_manifest())
        raise Refused(f"找不到检查点 {bad[0]!r}：可选 {known}（只测书里的检查点）", 2)
    if clean and names:
        raise Refused("--clean 只删根文件系统、不跑测试：去掉检查点名字", 2)
    return arch, [by_name(n).name for n in names], clean


def _run(cmd: list[str], **kw) -> tuple[int, str]:
    """跑一条命令，不打印它的输出；返回 (退出码, 原因)：第一条 E: / ERROR: 行（apt、pip 的第一条错最具体，比如
    连不上哪个地址），没有就是最后一行。找不到程序也当失败。"""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    except OSError as e:
        return 127, str(e)
    lines = [s.strip() for s in (res.stderr.strip() or res.stdout.strip()).splitlines()]
    errors = [s for s in lines if s.startswith(("E:", "ERROR:"))]
    return res.returncode, (errors or lines or [f"退出码 {res.returncode}"])[0 if errors else -1]


def _step(text: str, cmd: list[str], **kw) -> None:
    """一步一行：先打印在做什么，做完补上秒数；失败时抛 Refused，原因是命令输出的最后一行。"""
    print(f"{text}…", end="", flush=True)
    t0 = time.perf_counter()
    rc, last = _run(cmd, **kw)
    if rc != 0:
        print(flush=True)
        raise Refused(f"{text}失败：{last}")
    print(f" {time.perf_counter() - t0:.0f} 秒", flush=True)


def prepare_host(arch: str) -> None:
    """本机：Linux、x86、root；mmdebstrap、qemu 不在就用 apt-get 装；binfmt_misc 挂上、qemu-aarch64 登记好（带 F：
    chroot 进去不必往根里拷 qemu）。做不到就抛 Refused。"""
    if platform.system() != "Linux":
        raise Refused("--arch 只能在 Linux 上用（要 binfmt_misc、chroot、mount 命名空间）")
    if platform.machine().lower() in (arch, ARCHS[arch]):
        raise Refused(f"这台机器本身就是 {arch}：直接 python course.py test --no-real，不用模拟")
    if os.geteuid() != 0:
        raise Refused(f"--arch {arch} 要 root（mmdebstrap、chroot、mount）：sudo python3 course.py test --arch {arch}")
    missing = sorted({deb for exe, deb in HOST_TOOLS.items() if shutil.which(exe) is None})
    if missing:
        if shutil.which("apt-get") is None:
            raise Refused(f"缺 {'、'.join(missing)}，这台机器没有 apt-get，装不了：请用它的包管理器装上")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _step("本机：apt-get update", ["apt-get", "update", "-q"], env=env)
        _step(f"本机：装 {' '.join(missing)}", ["apt-get", "install", "-y", "-q", *missing, "debian-archive-keyring"],
              env=env)
    if not (BINFMT / "register").exists():
        _step("本机：挂上 binfmt_misc", ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
    entry = BINFMT / f"qemu-{arch}"
    if not entry.exists() or not entry.read_text().startswith("enabled\n"):
        _step(f"本机：登记 qemu-{arch}", ["update-binfmts", "--enable", f"qemu-{arch}"])
    text = entry.read_text() if entry.exists() else ""
    if not text.startswith("enabled\n") or not re.search(r"^flags:.*F", text, re.MULTILINE):
        raise Refused(f"binfmt_misc 里的 qemu-{arch} 没有启用或没有 F 标志（{entry}）：chroot 进去的程序没法执行")


def _pins() -> list[str]:
    """requirements.txt 里 WHEELS 的钉死版本：根里的版本和本机一样。"""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if m:
            pins[m[1].lower().replace("-", "_")] = f"{m[1]}=={m[2]}"
    if missing := [w for w in WHEELS if w not in pins]:
        raise Refused(f"requirements.txt 里没有钉死 {'、'.join(missing)} 的版本", 2)
    return [pins[w] for w in WHEELS]


def _key(arch: str) -> str:
    """根的键：决定结果的都在里面。有 QEMU_CPU：/src/.cache 里是在根里算的 HF 参考，换了模拟的 CPU 就重建。"""
    return hashlib.sha256(json.dumps([arch, SUITE, MIRROR, DEBS, PY, _pins(), QEMU_CPU]).encode()).hexdigest()[:16]


def in_root(root: Path, argv: list[str]) -> list[str]:
    """在根里执行 argv 的命令行：私有 mount 命名空间（退出时挂载自己消失），挂 /proc、/dev 和只写了 CPU 个数的 /sys，
    chroot，干净的环境变量（只多一个 QEMU_CPU，子进程的 qemu 也读它），工作目录 /src。"""
    script = ('set -e; R="$1"; shift; mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"; '
              'mount -t tmpfs sys "$R/sys"; mkdir -p "$R/sys/devices/system/cpu"; n=$(($(nproc) - 1)); '
              'for f in possible present; do echo "0-$n" > "$R/sys/devices/system/cpu/$f"; done; '
              f'export QEMU_CPU={QEMU_CPU}; exec chroot "$R" /usr/bin/env -i -C /src QEMU_CPU={QEMU_CPU} '
              'PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(root), *argv]


def ensure_root(arch: str) -> Path:
    """缓存里的根文件系统；没有（或 requirements.txt 变了）就从头建：先建在 root.partial，建好了才改名、写下键。
    旧版本留在仓库里的根先搬过来（arch_cache.adopt_old）。"""
    where, key = CACHE / arch, _key(arch)
    root, stamp = where / "root", where / "ready"
    arch_cache.adopt_old(arch, CACHE, OLD)
    if root.is_dir() and stamp.is_file() and stamp.read_text() == key:
        print(f"{arch}：用缓存的根文件系统（{root}）", flush=True)
        return root
    part = where / "root.partial"
    for old in (part, root):
        shutil.rmtree(old, ignore_errors=True)
    where.mkdir(parents=True, exist_ok=True)
    try:
        _build(arch, part)
    except Refused:
        shutil.rmtree(part, ignore_errors=True)  # 半个根不留（几个 GB）
        raise
    part.rename(root)
    stamp.write_text(key)
    return root


def _build(arch: str, part: Path) -> None:
    """从头建根的四步，每步一行进度。"""
    deb = ARCHS[arch]
    _step(f"{arch} 1/4：建 {deb} 的 Debian {SUITE} 根文件系统（mmdebstrap：{'、'.join(DEBS)}；约 4 分钟）",
          ["mmdebstrap", f"--arch={deb}", "--variant=minbase", f"--include={','.join(DEBS)}", SUITE, str(part),
           MIRROR])
    (part / "src").mkdir()
    _step(f"{arch} 2/4：在根里建 venv（/opt/venv）", ["chroot", str(part), "python3", "-m", "venv", "--without-pip",
                                                      "/opt/venv"])
    site = part / "opt" / "venv" / "lib" / f"python{PY}" / "site-packages"
    tags = [f"--platform=manylinux_2_{m}_{arch}" for m in range(17, 37)] + [f"--platform=manylinux2014_{arch}"]
    _step(f"{arch} 3/4：用本机的 pip 装 PyPI 的 {arch} wheel（{', '.join(_pins()[:2])} 等，连同依赖约 3 GB）",
          [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--only-binary=:all:", *tags,
           f"--python-version={PY}", "--implementation=cp", f"--abi=cp{PY.replace('.', '')}", "--target", str(site),
           *_pins()])
    # --target 把可执行文件放在 site-packages/bin，开头写的是本机的 python；根里只要 ninja（它是 arm64 的程序）
    if not (site / "bin" / "ninja").is_file():
        raise Refused(f"装好的 wheel 里没有 ninja 程序（{site / 'bin'}）：C++ 核编不了")
    shutil.move(site / "bin" / "ninja", part / "opt" / "venv" / "bin" / "ninja")
    shutil.rmtree(site / "bin")
    _step(f"{arch} 4/4：在模拟器里 import torch 试一次",
          in_root(part, ["python", "-c", f"import platform, torch; assert platform.machine() == {arch!r}"]))


def jobs(root: Path, arch: str, names: list[str]) -> list[tuple[str, list[str], dict]]:
    """tools.run_tests._run 的几份：每个检查点（没点名时是第 6 章）跑它的全部小模型一档。"""
    pytest = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-rs"]
    return [(f"{arch} · {n}（小模型一档）", in_root(root, [*pytest, "tests", "--checkpoint", n]), {})
            for n in names or [DEFAULT]]


@contextlib.contextmanager
def _lock(arch: str) -> Iterator[None]:
    """同一个根同时只给一次运行用（另一次的 sync_src 会删掉 /src 重拷）；已经有人在用就抛 Refused。"""
    (CACHE / arch).mkdir(parents=True, exist_ok=True)
    with open(CACHE / arch / "lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Refused(f"另一个 --arch {arch} 正在用同一个根（{CACHE / arch}）：等它跑完再来") from None
        yield


def _clean(arch: str) -> int:
    """--clean：删掉这份仓库的根（正在用的时候不删），说删了什么、腾出多少。"""
    with _lock(arch):
        try:
            said = arch_cache.clean(arch, CACHE, OLD)
        except OSError as e:
            raise Refused(f"删不掉 {e.filename}：{e.strerror}（根里的文件属于 root：sudo python3 course.py test "
                          f"--arch {arch} --clean）") from None
    print(f"删掉了 {arch} 的根文件系统：{'、'.join(said)}" if said else
          f"{arch} 没有缓存的根文件系统（{CACHE / arch}）")
    return 0


def run_arch(extra: list[str]) -> int:
    """python course.py test --arch aarch64 [chN …]：准备本机和根，拷工作区，一份一份跑，最后是和本机一样的摘要。"""
    try:
        arch, names, clean = parse(extra)
        if clean:
            return _clean(arch)
        prepare_host(arch)
        with _lock(arch):
            root = ensure_root(arch)
            n = sync_src(root)
            built = any((root / "root" / ".cache" / "torch_extensions").glob("minisgl_kernel_*/*.so"))
            print(f"{arch}：拷了 {n} 个文件到根里的 /src；在 qemu-user（{QEMU_CPU}）下跑 pytest"
                  f"{'' if built else '，第一次要在模拟器里编 C++ 核（约 6 分钟）'}。qemu-user 不执行 madvise，"
                  "根里也没有本机的 /sys：透明大页的测试会跳过", flush=True)
            passed, failed, details = run_tests._run(jobs(root, arch, names), dict(os.environ), 1)
            print(arch_cache.where_line(arch, CACHE), flush=True)
            return run_tests._finish(passed, failed, details)
    except Refused as e:
        print(f"错误：{e}", flush=True)
        return e.code
