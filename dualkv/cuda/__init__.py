"""CUDA kernels compiled at run time with NVRTC (cuda.core). Not built yet: see issue "CUDA kernels I"."""


def available() -> bool:
    return False
