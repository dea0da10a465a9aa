"""The field corpus's loader and scorer, for the tests: they live in bench/field_corpus.py (bench/ imports nothing
from tests/, and bench/ is no package), so this loads that file by its path and hands on its names."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import REPO_ROOT

_PATH = REPO_ROOT / "bench" / "field_corpus.py"
_NAME = "bench_field_corpus"


def _load():
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert spec is not None and spec.loader is not None, _PATH
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


_module = _load()
CAPACITY = _module.CAPACITY
CONFIDENT = _module.CONFIDENT
FIELD = _module.FIELD
NOT_CAPACITY = _module.NOT_CAPACITY
Case = _module.Case
CaseError = _module.CaseError
Run = _module.Run
Score = _module.Score
class_rate = _module.class_rate
load_case = _module.load_case
load_cases = _module.load_cases
render_table = _module.render_table
run_cases = _module.run_cases
score = _module.score
table = _module.table
