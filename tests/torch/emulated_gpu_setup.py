"""Builds loom_emulated_gpu (tests/torch/emulated_gpu.cc: PyTorch's CUDA device type over Loom's
emulated GPU, for the tests of loom_torch's CUDA path) against the installed torch. Tests only:
tests/torch/CMakeLists.txt runs it.

    python3 emulated_gpu_setup.py -q build_ext --build-lib OUT --build-temp TMP
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="loom_emulated_gpu",
    ext_modules=[CppExtension(name="loom_emulated_gpu", sources=["emulated_gpu.cc"],
                              extra_compile_args=["-O1", "-Wall"])],
    cmdclass={"build_ext": BuildExtension},
)
