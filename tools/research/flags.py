"""Flag-aware research over an SGLang tree: the catalog, the per-version index and a flag's verdict.

The catalog lives in `catalog.py`; the code verdict (`analyze_flag`) in `analysis.py` over the
per-version index of `index.py`. This module is the one import the agent and the CLI use.
"""

from tools.research.analysis import CodeVerdict, analyze_flag
from tools.research.catalog import FlagInfo, find_flag, flag_catalog
from tools.research.flag_index.lookup import FlagIndex
from tools.research.index import load_index
from tools.research.scan.help_text import catalog_from_host, parse_help_text

__all__ = [
    "CodeVerdict",
    "FlagIndex",
    "FlagInfo",
    "catalog_from_host",
    "find_flag",
    "analyze_flag",
    "flag_catalog",
    "load_index",
    "parse_help_text",
]
