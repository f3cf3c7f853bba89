"""Parts of the modules that read an SGLang tree directly with `ast`, without the index
(`tools.research.catalog`, `tools.research.readers`): a flag definition's values (`ast_values`), the
catalog from `--help` text (`help_text`), and what surrounds one read of a flag (`read_context`)."""
