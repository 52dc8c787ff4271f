"""A deferred module (base/deferred.py) is imported on first use, once, whole, whichever thread comes first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def fresh(code: str) -> str:
    """What `code` printed, run in an interpreter of its own (this one imported pyarrow long ago)."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# Eight threads reach for pyarrow at the same moment through a name bound before it was imported, half of them
# by importing a submodule.
FIRST_USE = """
import json, sys, threading
from cdc2ch.base import deferred
deferred.defer("pyarrow", "no_such_module_here", "json")
import pyarrow as pa
before = {"loaded": deferred.loaded("pyarrow"), "lib": "pyarrow.lib" in sys.modules}
start, seen = threading.Barrier(8), []
def use(i):
    start.wait()
    if i % 2:
        import pyarrow.compute as pc
        seen.append(pc.sum(pa.array([1, 2, 3])).as_py())
    else:
        seen.append(pa.table({"x": [1, 2, 3]}).num_rows)
threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
real = sys.modules["pyarrow"]
print(json.dumps({
    **before, "seen": sorted(seen), "after": deferred.loaded("pyarrow"),
    "registered": type(real).__name__, "same_table": pa.Table is real.Table,
    "submodule": real.compute is sys.modules["pyarrow.compute"],
    "missing": "no_such_module_here" in sys.modules, "json": type(sys.modules["json"]).__name__,
}))
"""


def test_a_deferred_module_is_imported_whole_on_first_use_from_any_thread():
    out = json.loads(fresh(FIRST_USE))
    assert out == {
        "loaded": False,
        "lib": False,  # `import pyarrow as pa` bound the stand-in and ran none of pyarrow
        "seen": [3, 3, 3, 3, 6, 6, 6, 6],  # every thread saw the whole module
        "after": True,
        "registered": "module",  # the real module replaced the stand-in for later imports
        "same_table": True,
        "submodule": True,  # a submodule imported through the stand-in is an attribute of the real module
        "missing": False,  # a module that is not installed is not stood in for
        "json": "module",  # nor one imported already
    }


# A Spark task's function holding `pa` in its globals is pickled on the driver before anything used pyarrow
# there (executor writes): the stand-in goes as the module's name, and arrives as the real module.
PICKLED = """
import pickle, sys
from cdc2ch.base import deferred
deferred.defer("pyarrow")
import pyarrow as pa
sent = pickle.dumps({"pa": pa})
assert not deferred.loaded("pyarrow")
print(pickle.loads(sent)["pa"] is sys.modules["pyarrow"] and sys.modules["pyarrow"].Table.__name__)
"""


def test_a_deferred_module_is_pickled_as_the_module_it_stands_for():
    assert fresh(PICKLED).strip() == "Table"
