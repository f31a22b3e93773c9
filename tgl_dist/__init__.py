"""tgl_dist: distributed training of temporal graph neural networks.

The top level stays small; each concept lives in its own subpackage
(``context``, ``dist``, ``data``, ``partition``, ``graph``, ``sampling``,
``loader``, ``memory``, ``nn``, ``models``, ``dtdg``, ``checkpoint``, ``metrics``).
"""
from tgl_dist.context import DistributedContext
from tgl_dist.errors import TGLDistError

__version__ = "0.1.0"
__all__ = ["DistributedContext", "TGLDistError", "__version__"]
