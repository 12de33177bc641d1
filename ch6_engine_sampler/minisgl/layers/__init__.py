"""算子层：每个算子自己管权重的形状、加载和张量并行的切法。"""

from .activation import silu_and_mul
from .attention import AttentionLayer
from .base import BaseOP, OPList, StateLessOP
from .embedding import ParallelLMHead, VocabParallelEmbedding
from .linear import LinearColParallelMerged, LinearOProj, LinearQKVMerged, LinearReplicated, LinearRowParallel
from .norm import RMSNorm, RMSNormFused
from .rotary import RotaryConfig, RotaryEmbedding, get_rope

__all__ = ["silu_and_mul", "AttentionLayer", "BaseOP", "StateLessOP", "OPList", "VocabParallelEmbedding",
           "ParallelLMHead", "LinearColParallelMerged", "LinearRowParallel", "LinearOProj", "LinearQKVMerged",
           "LinearReplicated", "RMSNorm", "RMSNormFused", "RotaryConfig", "RotaryEmbedding", "get_rope"]
