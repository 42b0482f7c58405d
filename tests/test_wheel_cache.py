"""The llama-cpp-python wheel is kept in the user's cache, in a folder keyed by its version, build flags, compiler
and CPU, so a second checkout on the same machine reuses it and other flags get a build of their own."""

from __future__ import annotations

import os
import re
import subprocess

from conftest import REPO


def wheel_dir(cache, *args: str) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    done = subprocess.run(["make", "-s", "--no-print-directory", "llamacpp-wheel-dir", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_wheel_folder_is_in_the_user_cache_and_keyed_by_version_and_build_flags(tmp_path):
    default = wheel_dir(tmp_path)
    assert re.fullmatch(rf"{tmp_path}/fairaudit/wheels/llama-cpp-python-0\.3\.36-[0-9a-f]{{12}}", default), default
    assert wheel_dir(tmp_path) == default  # a second checkout (or run) finds the same folder
    cuda = wheel_dir(tmp_path, "LLAMACPP_CMAKE_ARGS=-DLLAVA_BUILD=OFF -DGGML_CUDA=on")
    assert cuda != default and cuda.startswith(f"{tmp_path}/fairaudit/wheels/llama-cpp-python-0.3.36-")
