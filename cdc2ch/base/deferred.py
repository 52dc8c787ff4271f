"""Which libraries the command line imports only when first used: pyarrow, which a poll with nothing new never
touches, yet which cdc2ch's modules and the embedded engine's package (chdb) import at their top.

pyarrow and the numpy it brings cost a cron poll about 0.17 s and 68 MiB of its ~1 s and ~300 MiB. Deferred,
`import pyarrow` binds a stand-in module, and the first attribute read from it (`pa.Table`, or a submodule's
import) imports the real one, once, under a lock: threads that reach for it meanwhile wait rather than see a
half-imported module (the race of the standard library's `importlib.util.LazyLoader` before Python 3.12).
Only the command line defers (`cdc2ch.__main__`); a program using cdc2ch's Python API imports as it does.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

_LOCK = threading.RLock()


class _Deferred(types.ModuleType):
    """Stands in sys.modules for a module not imported yet; becomes a view of it on first use."""

    def __getattr__(self, attr: str) -> Any:  # only called for names not already copied here
        return getattr(self._load(), attr)

    def __reduce__(self) -> tuple[Callable[[str], types.ModuleType], tuple[str]]:
        # Pickled (a Spark task's function whose globals hold `pa`, sent to executors) as the module it stands
        # for, by name, as pickle and cloudpickle send a module; without it pickling the stand-in fails.
        return importlib.import_module, (self.__name__,)

    def _load(self) -> types.ModuleType:
        with _LOCK:
            real = self.__dict__.get("_deferred_real")
            if real is None:
                name = self.__name__
                if sys.modules.get(name) is self:
                    del sys.modules[name]  # so the import below runs the real module, and registers it
                real = importlib.import_module(name)
                # Holders of the stand-in (`import pyarrow as pa` ran before) read its names without a detour.
                self.__dict__.update(real.__dict__)
                self.__dict__["_deferred_real"] = real
            return real


def defer(*names: str) -> None:
    """Let `import <name>` bind a stand-in until the module is used, for each top-level module not yet
    imported (one imported already is left as it is)."""
    for name in names:
        if name not in sys.modules and importlib.util.find_spec(name) is not None:
            sys.modules[name] = _Deferred(name)


def loaded(name: str) -> bool:
    """Whether the module was really imported (not merely deferred)."""
    module = sys.modules.get(name)
    return module is not None and (not isinstance(module, _Deferred) or "_deferred_real" in module.__dict__)
