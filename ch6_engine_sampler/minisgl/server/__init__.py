from .args import engine_config, parse_args
from .launch import free_addr, launch_tp

__all__ = ["engine_config", "free_addr", "launch_tp", "parse_args"]
