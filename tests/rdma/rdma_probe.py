"""Does this machine list an RDMA device? (Same rule as the root conftest's skip of the `rdma` marker.)"""

from __future__ import annotations

import shutil
import subprocess


def device_listed() -> bool:
    tool = shutil.which("ibv_devices")
    if tool is None:
        return False
    out = subprocess.run([tool], capture_output=True, text=True, check=False)
    return out.returncode == 0 and any(ln.strip() for ln in out.stdout.splitlines()[2:])
