"""What a report becomes: text, comparison tables, the module-major view, plots, an HTML page,
diffs, report files (serde), and torch configs (a QConfigMapping, a PT2E quantizer)."""
