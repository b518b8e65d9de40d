"""tiktoken encodings loaded from the files litellm ships, never from the network.

tiktoken downloads its BPE files on first use unless ``TIKTOKEN_CACHE_DIR`` points at a folder
that already holds them; litellm ships ``o200k_base``, ``cl100k_base`` and ``p50k_base`` in
``litellm/litellm_core_utils/tokenizers/``. The folder is found without importing litellm.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path

import tiktoken


def litellm_package_dir() -> Path:
    """litellm's installed folder, found without importing litellm (that takes seconds)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        raise RuntimeError("litellm is not installed: its bundled tokenizer files are needed")
    return Path(spec.origin).parent


@cache
def litellm_tokenizer_dir() -> Path:
    return litellm_package_dir() / "litellm_core_utils" / "tokenizers"


def use_bundled_tokenizers() -> None:
    """Point tiktoken at litellm's files; call before the first encoding is loaded.

    Writes the environment only where it differs. The process calls this on its main thread
    before any other thread runs (the CLI, ``create_app``), so the threads that call it later
    (encodings loaded off the loop, litellm's import) only read: ``setenv`` adding a variable
    moves the C ``environ`` array, and another thread reading it meanwhile (a child's
    ``execve`` after ``vfork``, a ``getenv`` in name resolution) may read freed memory."""
    folder = str(litellm_tokenizer_dir())
    if os.environ.get("TIKTOKEN_CACHE_DIR") != folder:
        os.environ["TIKTOKEN_CACHE_DIR"] = folder
    if "LITELLM_LOCAL_MODEL_COST_MAP" not in os.environ:
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"


@cache
def encoding(name: str) -> tiktoken.Encoding:
    use_bundled_tokenizers()
    return tiktoken.get_encoding(name)


BUNDLED_ENCODINGS = ("o200k_base", "cl100k_base")


def warm_up() -> None:
    """Load the bundled encodings, so that no request pays for them: loading ``o200k_base``
    alone holds the interpreter for most of a second, and on a request's path that stalls
    every other client."""
    use_bundled_tokenizers()
    for name in BUNDLED_ENCODINGS:
        encoding(name)


def main() -> None:
    """``python -m compaction_proxy.metering.tokenizers``: load every bundled encoding (fails
    loudly if missing)."""
    for name in BUNDLED_ENCODINGS:
        print(f"{name}: {encoding(name).n_vocab} tokens")


if __name__ == "__main__":
    main()
