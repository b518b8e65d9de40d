"""``compaction-proxy serve`` with its bytecodes counted, for ``tests.bench.opcodes``.

Run as ``python <this file> serve --port P`` from the checkout to count (its directory is
put first on the path, so another checkout's package runs: run by path, not with ``-m``);
with ``BENCH_OPCODES_MODULE`` set, that module runs instead (``tests.bench.relay``: the bare
relay, with its own arguments).
SIGTTIN starts the count, SIGTTOU stops it and writes it to the file ``BENCH_OPCODES`` as
JSON: every function's bytecodes executed (``"<file>:<qualified name>": count``, files relative
to the checkout, to ``site-packages`` or to the standard library) and the frames entered (a
coroutine's every resumption is one). The tracer is CPython's (``sys.settrace`` with opcode
events), set for the event loop's thread and for threads started while counting: work a
big body sends to a thread that already existed is not counted (none of a benchmark's
bodies is big).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import sysconfig
import threading
from collections import Counter
from types import CodeType, FrameType, FunctionType
from typing import Any

import orjson

Tracer = Any  # sys.settrace's callback type is private to typeshed


class OpcodeCount:
    """Bytecodes executed per code object, and frames entered (a coroutine's resumption
    enters one), in all and per code object, between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.by_code: Counter[CodeType] = Counter()
        self.entered: Counter[CodeType] = Counter()
        self.frames = 0

    def _opcode(self, frame: FrameType, event: str, _arg: object) -> Tracer:
        if event == "opcode":
            self.by_code[frame.f_code] += 1
        return self._opcode

    def _call(self, frame: FrameType, _event: str, _arg: object) -> Tracer:
        self.frames += 1
        self.entered[frame.f_code] += 1
        frame.f_trace_opcodes = True
        return self._opcode

    def start(self, *_: object) -> None:
        self.by_code.clear()
        self.entered.clear()
        self.frames = 0
        sys.settrace(self._call)
        threading.settrace(self._call)

    def stop(self, *_: object) -> None:
        sys.settrace(None)
        threading.settrace(None)
        paths = sysconfig.get_paths()
        roots = (paths["purelib"], paths["stdlib"], os.getcwd())  # a venv may be in the checkout
        generated = _generated_methods()
        counts: dict[str, int] = {}
        entered: dict[str, int] = {}
        for code, count in self.by_code.items():
            name = generated.get(code) or f"{_relative(code.co_filename, roots)}:{code.co_qualname}"
            counts[name] = counts.get(name, 0) + count
            entered[name] = entered.get(name, 0) + self.entered[code]
        report = {"frames": self.frames, "opcodes": counts, "entered": entered}
        path = os.environ["BENCH_OPCODES"]
        with open(f"{path}.part", "wb") as out:
            out.write(orjson.dumps(report))
        os.replace(f"{path}.part", path)  # whole when it appears


def _generated_methods() -> dict[CodeType, str]:
    """The methods a dataclass (or namedtuple) was given from source built at run time, all
    named ``__create_fn__.<locals>.__init__`` in ``<string>``, by their class."""
    named: dict[CodeType, str] = {}
    classes, pending = set(), [object]  # every class (frozen objects escape ``gc``'s lists)
    while pending:
        for subclass in type.__subclasses__(pending.pop()):
            if subclass not in classes:
                classes.add(subclass)
                pending.append(subclass)
    for thing in classes:
        for method_name, method in list(vars(thing).items()):  # a lazy attribute may add more
            if not isinstance(method, FunctionType):
                continue
            code = method.__code__
            if code.co_filename == "<string>":
                named[code] = f"<generated>:{thing.__module__}.{thing.__qualname__}.{method_name}"
    return named


def _relative(path: str, roots: tuple[str, ...]) -> str:
    for root in roots:
        if path.startswith(root + os.sep):
            return path[len(root) + 1 :]
    return path


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # the checkout run from, not this file's directory
    count = OpcodeCount()
    signal.signal(signal.SIGTTIN, count.start)
    signal.signal(signal.SIGTTOU, count.stop)
    module = os.environ.get("BENCH_OPCODES_MODULE", "compaction_proxy")
    sys.argv[0] = module
    runpy.run_module(module, run_name="__main__", alter_sys=True)
