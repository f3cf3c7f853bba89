"""Parts of the catalog, which reads an SGLang tree directly with `ast`, without the index
(`tools.research.catalog`): a flag definition's values (`ast_values`) and the catalog from `--help`
text (`help_text`)."""
