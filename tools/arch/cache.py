"""--arch 的根文件系统放在哪里、多大、怎么删，往它的 /src 里拷什么（tools/arch/qemu.py 用）。

根（约 5 GB，/dev 下有设备文件，dev/fd 指向 /proc）不放在仓库里：仓库只装读者的代码和课程，复制、打包、遍历仓库
的工具（cp -r、shutil.copytree、备份）读到 dev/zero 这样的设备会一直读下去。它放在用户的缓存目录（$XDG_CACHE_HOME，
没有就 ~/.cache）下的 minisgl-course/arch-<仓库目录名>-<仓库路径的短哈希>/<架构>/：每份克隆一个（/src 每次重拷，
两份克隆共用一个根会互相删）。旧版本把它放在仓库的 .cache/arch/：同一个文件系统就搬过来（改名，瞬间完成），
搬不了就每次说一行它在哪、多大、怎么删。删：python course.py test --arch aarch64 --clean。
拷进 /src 的只有普通文件和指向仓库里面的链接：不读设备、管道，不带指向仓库外面的链接。
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from tools.manifest import ROOT


def cache_home() -> Path:
    """XDG 的缓存目录：$XDG_CACHE_HOME 是绝对路径就用它（规范说相对路径要忽略），否则 ~/.cache。"""
    env = os.environ.get("XDG_CACHE_HOME", "")
    return Path(env) if os.path.isabs(env) else Path.home() / ".cache"


CACHE = cache_home() / "minisgl-course" / f"arch-{ROOT.name}-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
OLD = ROOT / ".cache" / "arch"  # 旧版本放根的地方（仓库里面）
KEEP = {".cache", "models"}  # 根里 /src 留着的：根里算过的 HF 参考、根里做的小模型


class Refused(Exception):
    """跑不了：消息是给读者的一行原因。code 是退出码（2：命令行用错了；1：这台机器跑不了）。"""
    def __init__(self, why: str, code: int = 1):
        super().__init__(why)
        self.code = code




def disk_usage(path: Path) -> int:
    """目录占的磁盘字节数（和 du 一样按块算）：只 lstat，不跟链接、不读内容（根里有设备文件）。"""
    total = 0
    for top, dirs, files in os.walk(path):  # followlinks 默认 False：dev/fd -> /proc/self/fd 不进去
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
    return total


def human(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def shown(path: Path) -> str:
    """仓库里的路径写相对的，别处写绝对的。"""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def where_line(arch: str, cache: Path) -> str:
    """每次 --arch 跑完说的一行：根在哪、多大、怎么删。"""
    root = cache / arch
    return (f"{arch} 的根文件系统缓存在 {root}（{human(disk_usage(root))}），下次直接用；"
            f"删掉它：python course.py test --arch {arch} --clean")


def adopt_old(arch: str, cache: Path, old: Path) -> None:
    """旧版本留在仓库里的根（old/<架构>/root）：新位置还没有根就改名搬过来（同一个文件系统，不复制）；搬不了
    （不同的文件系统）或新位置已经有根，就说一行它在哪、多大、怎么删。不复制：复制一个根会去读里面的设备文件。"""
    src, dest = old / arch, cache / arch
    if not (src / "root").is_dir() and not (src / "root.partial").is_dir():
        return
    if (src / "root").is_dir() and not (dest / "root").exists():
        try:
            os.rename(src / "root", dest / "root")
        except OSError:
            pass
        else:
            if (src / "ready").is_file():
                os.replace(src / "ready", dest / "ready")
            shutil.rmtree(src, ignore_errors=True)  # 剩下的锁文件、没建完的 root.partial
            with contextlib.suppress(OSError):
                old.rmdir()  # 空了的 .cache/arch 也不留
            print(f"{arch}：旧版本把根文件系统放在仓库的 {shown(src)}，搬到了 {dest}", flush=True)
            return
    print(f"{arch}：仓库里还有旧版本留下的根文件系统 {shown(src)}（{human(disk_usage(src))}），已经不用了："
          f"python course.py test --arch {arch} --clean 删掉它", flush=True)


def clean(arch: str, cache: Path, old: Path) -> list[str]:
    """删掉这份仓库的 arch 根（缓存目录里的和旧版本留在仓库里的）连同空下来的目录；返回删了什么的说明（没有就是
    空表）。调用的人拿着锁：锁文件最后删（已经打开的锁不受影响）。删不掉（不是 root）时抛 OSError。"""
    said = []
    for path in [cache / arch / n for n in ("root", "root.partial", "ready")] + [old / arch]:
        if path.is_dir() and not path.is_symlink():
            size = disk_usage(path)
            shutil.rmtree(path)
            said.append(f"{shown(path)}（{human(size)}）")
        elif os.path.lexists(path):
            path.unlink()
    (cache / arch / "lock").unlink(missing_ok=True)
    for d in (cache / arch, cache, cache.parent, old):
        try:
            d.rmdir()  # 空了才删得掉
        except OSError:
            pass
    return said


def sync_src(root: Path) -> int:
    """把工作区拷进根里的 /src（git 跟踪的和没被忽略的文件）；除了 KEEP，上次拷的先删掉。返回文件个数。
    只拷普通文件和指向仓库里面的链接（照样是链接）：不读设备、管道，不带指向仓库外面的链接（根里没有它指的东西）。"""
    res = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         check=False)
    if res.returncode != 0:
        raise Refused("拷工作区要 git（git ls-files）：请在 git 克隆的仓库里运行")
    src = root / "src"
    src.mkdir(exist_ok=True)
    for p in src.iterdir():
        if p.name not in KEEP:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    files = [f for f in res.stdout.decode().split("\0") if f and _plain(ROOT / f)]
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f, follow_symlinks=False)
    return len(files)


def _plain(path: Path) -> bool:
    """普通文件，或指向仓库里面（的普通文件、目录）的链接。"""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    if stat.S_ISLNK(mode):
        target = path.resolve()
        return target.exists() and ROOT in target.parents
    return stat.S_ISREG(mode)
