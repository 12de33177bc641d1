from .launch import free_addr, launch_tp

__all__ = ["free_addr", "launch_tp"]
