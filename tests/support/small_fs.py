"""A small real file system for disk-full tests: a tmpfs, or an ext4 image on a loop device.

    with small_filesystem("tmpfs", 64, tmp_path) as mnt:   # or "ext4"
        ...                                                  # unmounted (and the image gone) after

Mounting needs root (tests run as root here and in CI). Without it the test FAILS with a clear
message: a disk-full test that skips silently proves nothing.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest


def _run(cmd) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({done.returncode}): "
                    f"{done.stderr.strip()}")


def _unmount(mnt: str) -> None:
    for _ in range(50):  # a just-killed broker may hold files for a moment
        if subprocess.run(["umount", mnt], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)


@contextlib.contextmanager
def small_filesystem(kind: str, size_mib: int, base_dir):
    if os.geteuid() != 0:
        pytest.fail("this test mounts a small file system (tmpfs / loop ext4) to fill it for "
                    "real, which needs root; run it as root (CI does)")
    mnt = os.path.join(str(base_dir), f"{kind}-mnt")
    os.makedirs(mnt, exist_ok=True)
    image = os.path.join(str(base_dir), "ext4.img")
    if kind == "tmpfs":
        _run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", mnt])
    elif kind == "ext4":
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", image])
        _run(["mount", "-o", "loop", image, mnt])
    else:
        raise ValueError(kind)
    try:
        yield mnt
    finally:
        _unmount(mnt)
        with contextlib.suppress(FileNotFoundError):
            os.remove(image)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def used_ratio(path: str) -> float:
    st = os.statvfs(path)
    return 1 - st.f_bfree / st.f_blocks


def write_ballast(path: str, size_bytes: int) -> None:
    """A file of real blocks the test removes to free space."""
    with open(path, "wb") as f:
        chunk = b"\xa5" * (1 << 20)
        f.writelines(chunk for _ in range(size_bytes // len(chunk)))
        f.flush()
        os.fsync(f.fileno())
