"""The flag index's parts (`tools.research.index` builds and loads it): which files are on the
serving path (`serving_path`), the index file read lazily (`lookup.FlagIndex`) and written
(`write`)."""
