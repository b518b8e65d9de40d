"""``python -m compaction_proxy.ops.healthcheck``: exit 0 when the local proxy answers ``/healthz``.

Used by the container's HEALTHCHECK; reads the port the proxy was configured with.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("COMPACTION_PROXY_PORT", "8080")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
