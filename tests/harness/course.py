"""检查点清单：实现在 tools/manifest.py（工具和测试共用），这里转给测试用。"""

from tools.manifest import (  # noqa: F401
    IGNORED_PARTS,
    LONG_PROMPT,
    MANIFEST,
    PROMPTS,
    ROOT,
    TINY_NEW_TOKENS,
    Checkpoint,
    checkpoint_files,
    find_checkpoint,
    load_manifest,
)
