"""Flag-aware research over an SGLang tree: the catalog, a flag's definition, readers, guards, verdict.

The catalog lives in `flag_catalog.py`, readers and guards in `flag_readers.py`; this module is the
one import the agent and the CLI use.
"""

from tools.flag_catalog import FlagInfo, catalog_from_host, find_flag, flag_catalog, parse_help_text
from tools.flag_readers import FlagReport, Reader, find_readers, guard_facts, research_flag

__all__ = [
    "FlagInfo",
    "FlagReport",
    "Reader",
    "catalog_from_host",
    "find_flag",
    "find_readers",
    "flag_catalog",
    "guard_facts",
    "parse_help_text",
    "research_flag",
]
