"""第 3 章测试的本地配置：每个测试前后都清掉 TP 身份。"""

import pytest

from minisgl.distributed import reset_tp_info


@pytest.fixture(autouse=True)
def fresh_tp_info():
    """每个算子在构造时读 TP 身份：每个测试前后都清掉，测试之间不串。"""
    reset_tp_info()
    try:
        yield
    finally:
        reset_tp_info()
