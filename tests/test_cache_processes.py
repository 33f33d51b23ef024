"""The kernel caches are safe for two processes at once (the default run uses two xdist
workers, and a figure's pieces run in parallel processes): two processes that generate and
compile the same activation's kernels into one empty cache at the same time both get the
right numbers, the cache ends with one complete module and no temporary files, and a third
process loads it from there (nothing generated) with the same numbers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

BUILD = """
import json, sys
import numpy as np
from theory_kit import kernels
from theory_kit.model.activations import get_activation
act = get_activation("linear")           # the cheapest kernels to compile
rng = np.random.default_rng(0)
S = rng.standard_normal((5, 2, 3))
b, q, a = 0.1 * rng.standard_normal((5, 2)), rng.uniform(0.5, 2, (5, 2)), rng.uniform(0.5, 1, (5, 2))
W, D, D2, w = kernels.sample_kernels(act, "numba").weights(S, b, q, a)
ref = kernels.sample_kernels(act, "numpy").weights(S, b, q, a)
print(json.dumps({"w": w.tolist(), "ref": ref[3].tolist(), "stats": kernels.STATS,
                  "path": str(kernels.cache_path(act, "numba"))}))
"""


def _start(cache: str) -> subprocess.Popen:
    # numba's own cache goes beside the generated module (or under $NUMBA_CACHE_DIR by its
    # path), so it is as empty as the codegen cache
    env = {**os.environ, "THEORY_KIT_CACHE": cache, "THEORY_KIT_BACKEND": "numba"}
    return subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_build_the_same_kernels_into_one_cache(tmp_path):
    cache = str(tmp_path / "cache")
    first, second = _start(cache), _start(cache)          # at the same time, empty cache
    runs = [_result(first), _result(second)]
    for run in runs:
        assert np.allclose(run["w"], run["ref"], rtol=1e-12, atol=1e-14)
    assert runs[0]["w"] == runs[1]["w"]                   # bit for bit
    folder = tmp_path / "cache" / "codegen"
    modules = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert modules and not [m for m in modules if m.startswith(".")], modules   # no temporaries
    assert os.path.basename(runs[0]["path"]) in modules
    third = _result(_start(cache))                        # from the cache: nothing generated
    assert third["stats"]["generated"] == 0 and third["stats"]["loaded"] >= 1
    assert third["w"] == runs[0]["w"]


def test_low_optimisation_kernels_never_reach_the_packages_cache():
    """The run compiles at LLVM level 1 (tests/conftest.py) only into a numba cache of its
    own: numba's cache index does not record the level, so level-1 code in the package's
    ``__pycache__`` would be loaded by production runs.  Fails if the level is lowered while
    numba caches beside the sources (an empty ``CACHE_DIR``) or anywhere in the package."""
    import numba
    import theory_kit
    if int(numba.config.OPT) == 3:
        return   # production level (the user's NUMBA_OPT): any cache is safe
    cache = numba.config.CACHE_DIR
    assert cache, f"numba level {int(numba.config.OPT)} with kernels cached beside the sources"
    package, cache = Path(theory_kit.__file__).resolve().parent, Path(cache).resolve()
    assert cache != package and package not in cache.parents, cache
