"""Builds loom_torch (Loom's torch.distributed backend) against the installed torch and libloom.

    LOOM_HOME=/path/to/loom pip install --no-build-isolation src/torch

LOOM_HOME is an install prefix (include/loom/loom.h, lib/libloom.so) or a build directory of this
repository (libloom.so at its top); without it, the repository's build/ is used. The extension
finds libloom at run time through its RPATH (LOOM_HOME's library directory).
--no-build-isolation: the extension must be built against the torch that will import it.
"""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))


def loom_paths():
    home = os.environ.get("LOOM_HOME", os.path.join(repo, "build"))
    home = os.path.abspath(home)
    for inc, lib in ((os.path.join(home, "include"), os.path.join(home, "lib")),
                     (os.path.join(repo, "include"), home)):
        if os.path.exists(os.path.join(inc, "loom", "loom.h")) and any(
                f.startswith("libloom.so") for f in os.listdir(lib) if os.path.isdir(lib)):
            return inc, lib
    raise SystemExit(
        f"loom_torch: no libloom under LOOM_HOME={home} (expected lib/libloom.so with "
        "include/loom/loom.h, or a build directory of the repository): build Loom first")


include_dir, lib_dir = loom_paths()

setup(
    name="loom_torch",
    version="0.1.0",
    description="Loom as a torch.distributed backend",
    packages=["loom_torch"],
    ext_modules=[
        CppExtension(
            name="loom_torch._C",
            sources=["csrc/loom_backend.cc", "csrc/module.cc"],
            include_dirs=[include_dir],
            library_dirs=[lib_dir],
            libraries=["loom"],
            extra_compile_args=["-O2", "-Wall"],
            extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
