"""Import an example script as a module (its folder on ``sys.path`` while it loads, for its
sibling imports), so tests can call its functions in-process."""
import importlib.util
import sys
from pathlib import Path


def load_script(path: Path, name: str):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(path.parent))
